"""The order in which the master last changed its tasks, so a console's "updated last" costs the
rows it shows, not every task kept."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["Recency"]

T = TypeVar("T")


class Recency(Generic[T]):
    """Objects (tasks) in the order they were last touched, the latest last.

    Held by identity, so a completed task and a live one reusing its id are two entries. The
    owner drops an object when it forgets it; until then it is held here too.
    """

    __slots__ = ("_order",)

    def __init__(self) -> None:
        self._order: dict[int, T] = {}

    def touch(self, item: T) -> None:
        """``item`` changed now: it becomes the latest."""
        order = self._order
        key = id(item)
        order.pop(key, None)
        order[key] = item

    def drop(self, item: T) -> None:
        self._order.pop(id(item), None)

    def latest(self) -> Iterator[T]:
        """The latest touched first."""
        return reversed(self._order.values())

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, item: object) -> bool:
        return self._order.get(id(item)) is item
