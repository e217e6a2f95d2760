"""Sorters: the order in which clients (roles, or frameworks within a role) are offered to.

Both sorters track, per client, an allocation as scalar quantities in thousandths
(``{"cpus": 4000, "mem": 1024000}``) against a pool total, and both compute the same
*weighted dominant share*: ``max(allocation[n] / total[n]) / weight`` over the names the
total has. They differ only in :meth:`Sorter.sort`:

* :class:`DRFSorter` — ascending share, ties broken by how many allocations the client
  received, then by name. The order is kept in a ``SortedList`` and only the client whose
  allocation changed is re-keyed; a change of the total marks every key stale and the
  order is rebuilt once, on the next read.
* :class:`RandomSorter` — a fresh weighted random permutation on every read (a client of
  weight ``w`` comes first with probability ``w / sum(weights)``), drawn lazily so a
  caller that stops after the first few clients pays for only those.

Iterating a sorter yields the same order as :meth:`Sorter.sort` without building a list;
do not change the sorter while iterating it. A client made inactive (:meth:`Sorter.set_active`)
keeps its allocation and share but is left out of the order, so a thousand suppressed
frameworks cost an allocation nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Mapping
from operator import itemgetter
from typing import Generic, Protocol, TypeVar

from agora.master.allocator.amounts import add_into
from agora.master.allocator.types import AllocatorError
from sortedcontainers import SortedList

__all__ = ["DRFSorter", "RandomSorter", "Sorter", "dominant_share"]

_Key = tuple[float, int, str]
_name_of = itemgetter(2)

K = TypeVar("K", bound=str)


class Sorter(Protocol[K]):
    """What the allocator needs from an ordering policy (Mesos ``sorter.hpp``)."""

    def add(self, client: K, weight: float = 1.0) -> None:
        """Start tracking ``client`` with no allocation; AllocatorError if already there."""

    def remove(self, client: K) -> None:
        """Stop tracking ``client`` (its allocation is forgotten); KeyError if unknown."""

    def set_active(self, client: K, active: bool) -> None:
        """An inactive client keeps its allocation and share but is left out of the order
        (Mesos's deactivate: a suppressed or disconnected framework is not walked past on
        every agent); clients start active."""

    def __contains__(self, client: object) -> bool: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[K]:
        """The clients in offer order, lazily; the sorter must not change meanwhile."""

    def set_weight(self, client: K, weight: float) -> None:
        """Weights divide the share; must be finite and > 0."""

    def weight(self, client: K) -> float: ...

    def allocated(self, client: K, amounts: Mapping[str, int]) -> None:
        """``client`` received ``amounts`` (thousandths per name)."""

    def unallocated(self, client: K, amounts: Mapping[str, int]) -> None:
        """``client`` gave ``amounts`` back; AllocatorError if it never had them."""

    def allocation(self, client: K) -> dict[str, int]:
        """A copy of what ``client`` holds."""

    def add_total(self, amounts: Mapping[str, int]) -> None:
        """The pool grew (an agent was added or activated)."""

    def remove_total(self, amounts: Mapping[str, int]) -> None:
        """The pool shrank; AllocatorError if it would go negative."""

    def total(self) -> dict[str, int]:
        """A copy of the pool total."""

    def share(self, client: K) -> float:
        """The weighted dominant share of ``client``."""

    def sort(self) -> list[K]:
        """Every active client, in offer order."""


def _check_weight(weight: float) -> float:
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise AllocatorError(f"weight must be a number, got {type(weight).__name__}")
    if not math.isfinite(weight) or weight <= 0:
        raise AllocatorError(f"weight must be finite and > 0, got {weight!r}")
    return float(weight)


def _subtract_into(target: dict[str, int], amounts: Mapping[str, int], what: str) -> None:
    for name, value in amounts.items():
        if target.get(name, 0) < value:
            raise AllocatorError(f"{what}: cannot remove {value} of {name!r}, only {target}")
    for name, value in amounts.items():
        left = target[name] - value
        if left:
            target[name] = left
        else:
            del target[name]


def dominant_share(allocation: Mapping[str, int], total: Mapping[str, int]) -> float:
    """``max(allocation[n] / total[n])`` over the names the total has (0.0 for none)."""
    share = 0.0
    get = total.get
    for name, value in allocation.items():
        pool = get(name)
        if pool:
            ratio = value / pool
            if ratio > share:
                share = ratio
    return share


class _Client:
    __slots__ = ("alloc", "count", "key", "weight")

    def __init__(self, weight: float) -> None:
        self.alloc: dict[str, int] = {}
        self.weight = weight
        self.count = 0
        self.key: _Key = (0.0, 0, "")


class _BaseSorter(Generic[K]):
    """Bookkeeping shared by both sorters: clients, their allocations, the pool total."""

    __slots__ = ("_clients", "_inactive", "_total")

    def __init__(self) -> None:
        self._clients: dict[K, _Client] = {}
        self._total: dict[str, int] = {}
        self._inactive: set[K] = set()

    def _get(self, client: K) -> _Client:
        try:
            return self._clients[client]
        except KeyError:
            raise KeyError(f"unknown sorter client {client!r}") from None

    def __contains__(self, client: object) -> bool:
        return client in self._clients

    def __len__(self) -> int:
        return len(self._clients)

    def weight(self, client: K) -> float:
        return self._get(client).weight

    def allocation(self, client: K) -> dict[str, int]:
        return dict(self._get(client).alloc)

    def total(self) -> dict[str, int]:
        return dict(self._total)

    def share(self, client: K) -> float:
        c = self._get(client)
        return dominant_share(c.alloc, self._total) / c.weight

    def sort(self) -> list[K]:
        return list(self)

    def __iter__(self) -> Iterator[K]:  # pragma: no cover - overridden
        raise NotImplementedError


class DRFSorter(_BaseSorter[K]):
    """Dominant Resource Fairness: lowest weighted dominant share first."""

    __slots__ = ("_dirty", "_order")

    def __init__(self) -> None:
        super().__init__()
        self._order: SortedList = SortedList()
        self._dirty = False

    def _key(self, name: K, c: _Client) -> _Key:
        return (dominant_share(c.alloc, self._total) / c.weight, c.count, name)

    def _rekey(self, name: K, c: _Client) -> None:
        if self._dirty or name in self._inactive:
            return  # keyed when the order is rebuilt, or when it is active again
        self._order.remove(c.key)
        c.key = self._key(name, c)
        self._order.add(c.key)

    def _rebuild(self) -> None:
        keys = []
        inactive = self._inactive
        for name, c in self._clients.items():
            if name not in inactive:
                c.key = self._key(name, c)
                keys.append(c.key)
        self._order = SortedList(keys)
        self._dirty = False

    def set_active(self, client: K, active: bool) -> None:
        c = self._get(client)
        if active == (client not in self._inactive):
            return
        if active:
            self._inactive.discard(client)
            if not self._dirty:
                c.key = self._key(client, c)
                self._order.add(c.key)
        else:
            self._inactive.add(client)
            if not self._dirty:
                self._order.remove(c.key)

    def add(self, client: K, weight: float = 1.0) -> None:
        if client in self._clients:
            raise AllocatorError(f"sorter client {client!r} already added")
        c = _Client(_check_weight(weight))
        self._clients[client] = c
        if not self._dirty:
            c.key = self._key(client, c)
            self._order.add(c.key)

    def remove(self, client: K) -> None:
        c = self._get(client)
        del self._clients[client]
        if client in self._inactive:
            self._inactive.discard(client)
        elif not self._dirty:
            self._order.remove(c.key)

    def set_weight(self, client: K, weight: float) -> None:
        c = self._get(client)
        c.weight = _check_weight(weight)
        self._rekey(client, c)

    def allocated(self, client: K, amounts: Mapping[str, int]) -> None:
        c = self._get(client)
        add_into(c.alloc, amounts)
        c.count += 1
        if not self._dirty and client not in self._inactive:
            order = self._order
            order.remove(c.key)
            c.key = key = (dominant_share(c.alloc, self._total) / c.weight, c.count, client)
            order.add(key)

    def unallocated(self, client: K, amounts: Mapping[str, int]) -> None:
        c = self._get(client)
        _subtract_into(c.alloc, amounts, f"sorter client {client!r}")
        self._rekey(client, c)

    def add_total(self, amounts: Mapping[str, int]) -> None:
        if amounts:
            add_into(self._total, amounts)
            self._dirty = True

    def remove_total(self, amounts: Mapping[str, int]) -> None:
        if amounts:
            _subtract_into(self._total, amounts, "sorter total")
            self._dirty = True

    def __iter__(self) -> Iterator[K]:
        if self._dirty:
            self._rebuild()
        return map(_name_of, self._order)


class RandomSorter(_BaseSorter[K]):
    """A weighted random order, drawn afresh on every read; deterministic given the seed."""

    __slots__ = ("_names", "_rng")

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self._rng = random.Random(seed)
        self._names: list[K] = []

    def add(self, client: K, weight: float = 1.0) -> None:
        if client in self._clients:
            raise AllocatorError(f"sorter client {client!r} already added")
        self._clients[client] = _Client(_check_weight(weight))
        self._names.append(client)

    def remove(self, client: K) -> None:
        self._get(client)
        del self._clients[client]
        self._names.remove(client)
        self._inactive.discard(client)

    def set_active(self, client: K, active: bool) -> None:
        self._get(client)
        if active:
            self._inactive.discard(client)
        else:
            self._inactive.add(client)

    def set_weight(self, client: K, weight: float) -> None:
        self._get(client).weight = _check_weight(weight)

    def allocated(self, client: K, amounts: Mapping[str, int]) -> None:
        c = self._get(client)
        add_into(c.alloc, amounts)
        c.count += 1

    def unallocated(self, client: K, amounts: Mapping[str, int]) -> None:
        _subtract_into(self._get(client).alloc, amounts, f"sorter client {client!r}")

    def add_total(self, amounts: Mapping[str, int]) -> None:
        add_into(self._total, amounts)

    def remove_total(self, amounts: Mapping[str, int]) -> None:
        _subtract_into(self._total, amounts, "sorter total")

    def __iter__(self) -> Iterator[K]:
        clients = self._clients
        first = next(iter(clients.values()), None)
        if first is not None and any(c.weight != first.weight for c in clients.values()):
            return self._weighted()
        return self._uniform()

    def _active_names(self) -> list[K]:
        inactive = self._inactive
        return [n for n in self._names if n not in inactive] if inactive else list(self._names)

    def _uniform(self) -> Iterator[K]:
        # Fisher-Yates, one step per client taken.
        names = self._active_names()
        rand = self._rng.randrange
        n = len(names)
        for i in range(n):
            j = rand(i, n)
            names[i], names[j] = names[j], names[i]
            yield names[i]

    def _weighted(self) -> Iterator[K]:
        # Efraimidis-Spirakis: order by u ** (1 / w), largest first.
        rand = self._rng.random
        clients = self._clients
        keyed = sorted(
            ((rand() ** (1.0 / clients[name].weight), name) for name in self._active_names()),
            reverse=True,
        )
        for _, name in keyed:
            yield name
