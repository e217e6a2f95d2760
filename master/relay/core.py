"""The relay's books: the agents behind it and what they are told about the leader (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from agora.sdk.messages import LeaderInfo

__all__ = ["DEFAULT_MAX_AGENTS", "Downstream", "Verdict", "leader_info"]

#: Most agents one relay serves by default; an agent beyond it is not carried.
DEFAULT_MAX_AGENTS: Final = 50_000


def leader_info(me: str, epoch: int, leading: bool) -> LeaderInfo:
    """What the relay says about the leader: itself while a master leads behind it (at that
    master's epoch), else nobody. To its agents, the relay is the whole group."""
    return LeaderInfo(responder=me, leader=me if leading else None, epoch=epoch, masters=(me,))


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with an agent's frame: carry it (``carry``), and whether the agent is new
    (``new``: tell it about the leader first)."""

    carry: bool
    new: bool


class Downstream:
    """The agents behind the relay, by routing id, least recently heard first.

    An agent is forgotten when it has been silent ``idle`` seconds (a master pings its agents,
    so a live one is heard) or when a send to it finds it gone. At most ``max_agents`` are
    kept: a new agent beyond that is refused until one is forgotten.
    """

    def __init__(self, *, idle: float, max_agents: int = DEFAULT_MAX_AGENTS) -> None:
        if idle <= 0 or max_agents < 1:
            raise ValueError("idle must be > 0 and max_agents >= 1")
        self._idle = idle
        self._max = max_agents
        self._heard: OrderedDict[bytes, float] = OrderedDict()

    @property
    def idle(self) -> float:
        return self._idle

    def __len__(self) -> int:
        return len(self._heard)

    def __iter__(self) -> Iterator[bytes]:
        return iter(tuple(self._heard))

    def heard(self, agent: bytes, now: float) -> Verdict:
        heard = self._heard
        if agent in heard:
            heard[agent] = now
            heard.move_to_end(agent)
            return Verdict(carry=True, new=False)
        if len(heard) >= self._max:
            return Verdict(carry=False, new=False)
        heard[agent] = now
        return Verdict(carry=True, new=True)

    def forget(self, agent: bytes) -> None:
        self._heard.pop(agent, None)

    def expire(self, now: float) -> list[bytes]:
        """Forget the agents silent for ``idle`` seconds; returns them."""
        gone: list[bytes] = []
        heard = self._heard
        while heard:
            agent, last = next(iter(heard.items()))
            if now - last < self._idle:
                break
            del heard[agent]
            gone.append(agent)
        return gone
