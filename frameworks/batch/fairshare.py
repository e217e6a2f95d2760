"""Fair share between users: usage that decays with a half-life, plus what runs now.

A user's *usage* is the cpu-seconds their finished tasks held, halved every ``half_life``
seconds (Slurm's ``PriorityDecayHalfLife``). Deciding who goes next by finished usage alone would
hand a whole offer to one user (nothing they just launched has finished), so the ordering key is a
*projection*: decayed usage, plus, for each task running now, its cpus times the user's typical
task run time (a moving average of what finished, ``default_runtime`` until something has). The
key is divided by the user's share (1 unless configured). Time is passed in; nothing here reads a
clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["FairShare"]

_EMA_WEIGHT = 0.2  # how much one finished task moves a user's typical run time


@dataclass(slots=True)
class _User:
    usage: float = 0.0  # cpu-seconds, decayed to ``as_of``
    as_of: float = 0.0
    running_cpus: float = 0.0
    typical_runtime: float | None = None


class FairShare:
    def __init__(
        self,
        half_life: float,
        *,
        shares: Mapping[str, float] | None = None,
        default_runtime: float = 10.0,
    ) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        self.half_life = half_life
        self.shares = dict(shares or {})
        self.default_runtime = default_runtime
        self._users: dict[str, _User] = {}
        self._changed: set[str] = set()

    def _user(self, name: str) -> _User:
        user = self._users.get(name)
        if user is None:
            user = self._users[name] = _User()
        return user

    def _decay(self, user: _User, now: float) -> None:
        if now > user.as_of:
            user.usage *= math.pow(0.5, (now - user.as_of) / self.half_life)
            user.as_of = now

    # ------------------------------------------------------------------ changes

    def restore(self, usage: Mapping[str, tuple[float, float]]) -> None:
        """Usage as saved: user -> (usage, as_of)."""
        for name, (value, as_of) in usage.items():
            user = self._user(name)
            user.usage, user.as_of = value, as_of

    def started(self, name: str, cpus: float) -> None:
        self._user(name).running_cpus += cpus

    def ended(self, name: str, cpus: float, runtime: float, now: float) -> None:
        """A task of ``name`` holding ``cpus`` ran ``runtime`` seconds and is over."""
        user = self._user(name)
        user.running_cpus = max(0.0, user.running_cpus - cpus)
        self._decay(user, now)
        user.usage += cpus * max(0.0, runtime)
        typical = user.typical_runtime
        runtime = max(0.0, runtime)
        user.typical_runtime = (
            runtime if typical is None else typical + _EMA_WEIGHT * (runtime - typical)
        )
        self._changed.add(name)

    def forget_running(self, name: str, cpus: float) -> None:
        """A task that held ``cpus`` ended without running (never started, lost)."""
        user = self._user(name)
        user.running_cpus = max(0.0, user.running_cpus - cpus)

    # ------------------------------------------------------------------ reading

    def usage(self, name: str, now: float) -> float:
        """Decayed cpu-seconds of ``name``'s finished tasks."""
        user = self._users.get(name)
        if user is None:
            return 0.0
        self._decay(user, now)
        return user.usage

    def key(self, name: str, now: float) -> float:
        """Lower goes first: projected usage over the user's share."""
        user = self._users.get(name)
        if user is None:
            return 0.0
        self._decay(user, now)
        typical = self.default_runtime if user.typical_runtime is None else user.typical_runtime
        projected = user.usage + user.running_cpus * max(typical, 1e-3)
        return projected / self.shares.get(name, 1.0)

    def take_changed(self, now: float) -> dict[str, tuple[float, float]]:
        """(usage, as_of) of the users whose usage changed since the last call (to save)."""
        out = {}
        for name in self._changed:
            user = self._users[name]
            self._decay(user, now)
            out[name] = (user.usage, user.as_of)
        self._changed.clear()
        return out
