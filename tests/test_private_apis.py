"""A framework's private API is used only in fastpaths/ (STYLE.md 14), read from the source.

Flagged: an attribute with a leading underscore read off anything but `self` or `cls`
(`serializer._context`, `message._state`, `app._pool`), outside fastpaths/, migrations and tests.
Django's documented `_meta` is public. The uses still outside are listed in `LEFT`, each with
why it is there: issue 19 moves or removes them; a new one is a failing test, not a surprise.
"""

from __future__ import annotations

import ast

from tests.test_import_rules import LAYERS, module_name, source_files

# "module: expression" -> why it is still outside fastpaths/.
LEFT = {
    "delivery.breakers: breaker._state_storage": "pybreaker's shared state read for the replayed call",
    "delivery.breakers: breaker._lock": "pybreaker's lock around the replayed call",
    "delivery.permissions: generator._get_paths_and_endpoints": "drf-spectacular's hook has no public list",
    "delivery.providers.smtp: lane._lane": "first-party: another instance of the same class",
    "core.api_schema: super()._map_serializer_field": "drf-spectacular's AutoSchema extension points",
    "core.api_schema: super()._insert_field_validators": "drf-spectacular's AutoSchema extension points",
    "core.api_schema: super()._map_basic_serializer": "drf-spectacular's AutoSchema extension points",
    "core.api_schema: super()._get_request_for_media_type": "drf-spectacular's AutoSchema extension points",
    "core.api_schema: super()._get_request_body": "drf-spectacular's AutoSchema extension points",
}


def private_uses() -> set[str]:
    found = set()
    for path in source_files():
        module = module_name(path)
        if module.split(".")[0] == "fastpaths":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr == "_meta":
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.add(f"{module}: {ast.unparse(node)}")
    return found


def test_no_private_framework_api_outside_the_fast_path_package() -> None:
    assert "fastpaths" in LAYERS
    assert private_uses() - LEFT.keys() == set()


def test_the_list_of_uses_left_is_current() -> None:
    assert LEFT.keys() - private_uses() == set()
