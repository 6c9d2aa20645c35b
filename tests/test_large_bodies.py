"""core/large_bodies.py: a request with a body of a megabyte or more is preceded by a garbage
collection (what earlier large requests left in reference cycles is freed), a small one is not.
The memory itself is bench/attachments.py's figure (a process's RSS is no test's to bound)."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator

import pytest
from rest_framework.test import APIClient

from core.large_bodies import COLLECT_ABOVE_BYTES


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generations of the collections that run, with the automatic ones switched off."""
    seen: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    enabled = gc.isenabled()
    gc.disable()
    gc.callbacks.append(count)
    try:
        yield seen
    finally:
        gc.callbacks.remove(count)
        if enabled:
            gc.enable()


def test_a_large_body_is_preceded_by_a_full_collection_and_a_small_one_is_not(
    api: APIClient, collections: list[int]
) -> None:
    small = {"to": "ann@example.com", "subject": "s", "text": "t"}
    assert api.post("/api/v1/messages", small, format="json").status_code == 202
    assert collections == []
    large = json.dumps({**small, "text": "x" * COLLECT_ABOVE_BYTES})
    assert api.post("/api/v1/messages", large, content_type="application/json").status_code == 202
    assert collections == [2]
