"""The master process collects garbage less often than CPython's default and leaves what it
imported out of every collection (a storm of re-registrations allocates millions of objects)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from agora.master.server.main import GC_THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_tune_gc_raises_the_thresholds_and_freezes_what_exists() -> None:
    survivor = [object() for _ in range(10)]
    tune_gc()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert GC_THRESHOLDS[0] > 700  # fewer young collections than CPython's default
    assert gc.get_freeze_count() > len(survivor)
