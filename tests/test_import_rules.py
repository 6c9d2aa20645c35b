"""The import rules of docs/architecture.md ("Layers"), read from the source with `ast`.

The layers, top first (`LAYER_ORDER` below, bottom first); a module imports only from its own
layer and those under it:

    configuration   emailhub (settings, urls, wsgi, celery, gunicorn)
    operations      operations (the admin's dashboard across every app)
    scheduling      scheduling
    campaign work   campaigns: fan-out, lifecycle, reporting, engagement, imports, admin, API
    outbound        outbound (the application's webhook endpoints and their deliveries)
    delivery        delivery
    campaign data   campaigns: models, selectors, services, progress, suppressions, unsubscribe links
    fast paths      fastpaths (speed-ups on frameworks' private internals)
    core            core

- The Celery app (`emailhub.celery`) is the one module of the configuration every layer may
  import; nothing else of `emailhub` is imported from below it.
- `core` imports no app and no fast path (its publisher is named by a setting); `fastpaths`
  imports `core` and the Celery app only: the apps choose a fast path, a fast path knows no app.
- An app imports another app only through its public modules (`PUBLIC` below: models, services,
  selectors, exceptions and the state-machine modules other apps call); never its admin, API,
  tasks, providers or any other internal module.
- The graph of module-level imports between first-party modules has no cycle.
- No first-party import inside a function (the way a cycle is dodged), except in
  `AppConfig.ready()`, where Django wants signal, check and metric registration.

Migrations, tests, benchmarks and scripts are outside the rules. Each rule is checked by a
function that returns the violations, and each has a test that feeds it a violating module.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("campaigns", "scheduling", "delivery", "outbound", "operations")
LAYERS = ("emailhub", *APPS, "fastpaths", "core")
# Bottom first. A module is in the layer of the longest prefix that names it.
LAYER_ORDER: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("core", ("core",)),
    ("fast paths", ("fastpaths",)),
    (
        "campaign data",
        (
            "campaigns.models",
            "campaigns.selectors",
            "campaigns.services",
            "campaigns.progress",
            "campaigns.suppressions",
            "campaigns.exceptions",
            "campaigns.unsubscribe",
        ),
    ),
    ("delivery", ("delivery",)),
    ("outbound", ("outbound",)),
    ("campaign work", ("campaigns",)),
    ("scheduling", ("scheduling",)),
    ("operations", ("operations",)),
    ("configuration", ("emailhub",)),
)
# What each app offers the others. Anything not listed here is that app's own business.
PUBLIC: dict[str, set[str]] = {
    "campaigns": {
        "models",
        "services",
        "selectors",
        "exceptions",
        "lifecycle",
        "progress",
        "erasure",
        "suppressions",
        "unsubscribe",
        "segments",
    },
    "scheduling": {"models", "services", "selectors", "exceptions"},
    "delivery": {"models", "services", "selectors", "exceptions"},
    "outbound": {"models", "services", "selectors", "exceptions"},
    "operations": set(),
}
# What an app (or core) may take from the configuration package.
CONFIG_PUBLIC = {"emailhub.celery"}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or module.name), dotted
    line: int
    in_function: bool
    in_ready: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> Iterator[Path]:
    for layer in LAYERS:
        for path in sorted((ROOT / layer).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield path


def is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports_of(module: str, tree: ast.AST) -> list[Import]:
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool, in_ready: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if is_type_checking_block(child):
                continue  # annotations only, never executed
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                visit(child, True, in_ready or child.name == "ready")
                continue
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                targets = [f"{child.module}.{alias.name}" for alias in child.names]
            for target in targets:
                if target.split(".")[0] in LAYERS:
                    found.append(Import(module, target, child.lineno, in_function, in_ready))
            visit(child, in_function, in_ready)

    visit(tree, False, False)
    return found


def all_imports(files: Iterable[Path] | None = None) -> tuple[set[str], list[Import]]:
    modules, imports = set(), []
    for path in files if files is not None else source_files():
        name = module_name(path)
        modules.add(name)
        imports.extend(imports_of(name, ast.parse(path.read_text(), str(path))))
    return modules, imports


def resolve(target: str, modules: set[str]) -> str:
    """`from a.b import c` names module a.b.c when that module exists, else a.b."""
    return target if target in modules else target.rsplit(".", 1)[0]


def layer_of(module: str) -> int:
    """The index in LAYER_ORDER of the layer `module` belongs to."""
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYER_ORDER):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    return best


def layering_violations(modules: set[str], imports: list[Import]) -> list[str]:
    bad = []
    for imp in imports:
        target = resolve(imp.target, modules)
        src_layer, dst_layer = imp.source.split(".")[0], target.split(".")[0]
        where = f"{imp.source}:{imp.line} imports {target}"
        if any(target == m or target.startswith(m + ".") for m in CONFIG_PUBLIC):
            continue  # the Celery app: every layer's
        if layer_of(target) > layer_of(imp.source):
            source_name, target_name = LAYER_ORDER[layer_of(imp.source)][0], LAYER_ORDER[layer_of(target)][0]
            bad.append(f"{where}: {source_name} is below {target_name}")
        elif dst_layer in APPS and src_layer != dst_layer and src_layer != "emailhub":
            parts = target.split(".")
            if len(parts) < 2 or parts[1] not in PUBLIC[dst_layer]:
                bad.append(f"{where}: not one of {dst_layer}'s public modules {sorted(PUBLIC[dst_layer])}")
    return bad


def function_import_violations(imports: list[Import]) -> list[str]:
    return [
        f"{imp.source}:{imp.line} imports {imp.target} inside a function"
        for imp in imports
        if imp.in_function and not imp.in_ready
    ]


def cycles(modules: set[str], imports: list[Import]) -> list[list[str]]:
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if imp.in_function:
            continue
        target = resolve(imp.target, modules)
        if target in modules and target != imp.source:
            graph[imp.source].add(target)
            # Importing a.b.c first imports the packages a and a.b.
            parent = target.rsplit(".", 1)[0] if "." in target else None
            while parent and parent in modules and parent != imp.source:
                if not imp.source.startswith(parent + "."):
                    graph[imp.source].add(parent)
                parent = parent.rsplit(".", 1)[0] if "." in parent else None
    found, state, stack = [], dict.fromkeys(graph, 0), []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif state[nxt] == 0:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            walk(node)
    return found


# The rules on the code as it is.


def test_layers_point_one_way_and_apps_meet_only_through_public_modules() -> None:
    modules, imports = all_imports()
    assert layering_violations(modules, imports) == []


def test_no_first_party_import_hides_inside_a_function() -> None:
    _, imports = all_imports()
    assert function_import_violations(imports) == []


def test_module_import_graph_has_no_cycle() -> None:
    modules, imports = all_imports()
    assert cycles(modules, imports) == []


# Each rule fails on a violation (fed as a tree of its own, so the real code stays untouched).


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, str]], list[Path]]:
    """Write modules ({dotted name: source}) under a root of their own, which the rules then read."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return lambda files: write(tmp_path, files)


def write(tmp: Path, files: dict[str, str]) -> list[Path]:
    paths = []
    for name, text in files.items():
        path = tmp / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths.append(path)
    return paths


def test_the_rules_catch_an_internal_import_a_function_import_and_a_cycle(
    tree: Callable[[dict[str, str]], list[Path]],
) -> None:
    files = tree(
        {
            "core.__init__": "",
            "core.outbox": "from delivery.models import Message\nimport fastpaths.publish\nfrom emailhub import settings\nfrom emailhub.celery import app\n",
            "fastpaths.__init__": "",
            "fastpaths.publish": "from delivery.services import messages\n",
            "delivery.__init__": "",
            "delivery.models": "from campaigns.fanout import step\n",
            "delivery.services": "def f():\n    from campaigns.lifecycle import pause\n",
            "scheduling.__init__": "",
            "scheduling.dispatch": "from campaigns.admin import CampaignAdmin\n",
            "campaigns.__init__": "",
            "campaigns.fanout": "from campaigns.lifecycle import pause\n",
            "campaigns.lifecycle": "from campaigns.fanout import step\n",
            "campaigns.apps": "class C:\n    def ready(self):\n        from campaigns import fanout\n",
        },
    )
    modules, imports = all_imports(files)
    layering = layering_violations(modules, imports)
    assert sorted(layering) == [
        "core.outbox:1 imports delivery.models: core is below delivery",
        "core.outbox:2 imports fastpaths.publish: core is below fast paths",
        "core.outbox:3 imports emailhub: core is below configuration",
        "delivery.models:1 imports campaigns.fanout: delivery is below campaign work",
        "delivery.services:2 imports campaigns.lifecycle: delivery is below campaign work",
        "fastpaths.publish:1 imports delivery.services: fast paths is below delivery",
        "scheduling.dispatch:1 imports campaigns.admin: not one of campaigns's public modules "
        f"{sorted(PUBLIC['campaigns'])}",
    ]
    assert function_import_violations(imports) == [
        "delivery.services:2 imports campaigns.lifecycle.pause inside a function"
    ]
    assert ["campaigns.fanout", "campaigns.lifecycle", "campaigns.fanout"] in cycles(modules, imports)


# Each app's errors live in its exceptions.py (issue 19): a reader looks for what a module raises
# in one place, and a caller catches it without importing the module that raises it.


def exception_classes_outside_exceptions_modules(files: Iterable[Path] | None = None) -> list[str]:
    """Public exception classes an app defines anywhere but its exceptions.py (private ones,
    `_Lost`, are a module's own business)."""
    found = []
    for path in files if files is not None else source_files():
        module = module_name(path)
        app = module.split(".")[0]
        if app not in APPS or module == f"{app}.exceptions" or ".testing" in module:
            continue
        for node in ast.parse(path.read_text(), str(path)).body:
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
            if any(base.endswith(("Exception", "Error")) for base in bases):
                found.append(f"{module}.{node.name}")
    return found


def test_an_apps_exceptions_live_in_its_exceptions_module() -> None:
    assert exception_classes_outside_exceptions_modules() == []


def test_the_exceptions_rule_catches_an_error_defined_elsewhere(
    tree: Callable[[dict[str, str]], list[Path]],
) -> None:
    files = tree(
        {
            "delivery.__init__": "",
            "delivery.exceptions": "class DeliveryError(Exception): ...\n",
            "delivery.gateway": "class Skipped(Exception): ...\nclass _Lost(Exception): ...\n",
            "delivery.api": "from rest_framework import exceptions\nclass Big(exceptions.APIException): ...\n",
        },
    )
    assert sorted(exception_classes_outside_exceptions_modules(files)) == [
        "delivery.api.Big",
        "delivery.gateway.Skipped",
    ]
