"""bench/'s layout: entry scripts share helpers through bench/lib/, never through each other.

An entry script is a bench/ module with a `main` or an `if __name__ == "__main__":` block. One
that imported another ran the other's module-level set-up (its sys.path, its database and Redis
names) and tied two benchmarks' internals together (issue 19, part 5); what several benches
need lives in bench/lib/, which holds no entry script. Read with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_entry_script(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "main":
            return True
        if (
            isinstance(node, ast.If)
            and "__main__" in ast.unparse(node.test)
            and "__name__" in ast.unparse(node.test)
        ):
            return True
    return False


def imported(tree: ast.Module) -> Iterator[str]:
    """Every module an import names (at any depth: a function's own import counts), with
    `from bench import x` read as bench.x."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def violations(root: Path) -> list[str]:
    trees = {module_name(path, root): ast.parse(path.read_text()) for path in sorted(root.rglob("*.py"))}
    entries = {name for name, tree in trees.items() if is_entry_script(tree)}
    found = [f"{name} is shared code with a main" for name in sorted(entries) if ".lib." in f"{name}."]
    for name, tree in trees.items():
        for target in sorted(set(imported(tree)) & entries - {name}):
            found.append(f"{name} imports the entry script {target}")
    return found


def test_no_entry_script_imports_another_and_bench_lib_has_none() -> None:
    assert violations(BENCH) == []


def test_the_bench_has_entry_scripts_and_shared_modules_to_check() -> None:
    trees = {path.name: ast.parse(path.read_text()) for path in BENCH.glob("*.py")}
    assert {"transactional.py", "fanout.py", "campaign.py"} <= {
        n for n, t in trees.items() if is_entry_script(t)
    }
    assert {"common.py", "stats.py", "api.py", "audience.py", "smtp_sink.py"} <= {
        path.name for path in (BENCH / "lib").glob("*.py")
    }


def test_the_check_finds_an_entry_script_imported_anywhere(tmp_path: Path) -> None:
    root = tmp_path / "bench"
    (root / "lib").mkdir(parents=True)
    files = {
        "a.py": "def main() -> None: ...\n",
        "b.py": "from bench.a import main\n\nif __name__ == '__main__':\n    main()\n",
        "c.py": "def main() -> None:\n    from bench import b\n",
        "lib/shared.py": "import bench.a\n\n\ndef main() -> None: ...\n",
        "lib/fine.py": "from bench.lib.shared import x\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    assert violations(root) == [
        "bench.lib.shared is shared code with a main",
        "bench.b imports the entry script bench.a",
        "bench.c imports the entry script bench.b",
        "bench.lib.fine imports the entry script bench.lib.shared",
        "bench.lib.shared imports the entry script bench.a",
    ]
