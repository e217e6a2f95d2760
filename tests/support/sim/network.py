"""A simulated network of named peers that carries encoded frames.

Every message is encoded with ``agora.sdk.codec`` when sent and decoded when delivered, so
the wire format is exercised by every simulated exchange. The network can

* delay: each frame gets a random latency in ``[latency_min, latency_max]``;
* reorder: latencies differ per frame, so frames of different links interleave in any
  order. One directed link (A -> B) stays FIFO by default, as ZeroMQ over TCP is, and as
  Mesos promises ("ordered but unreliable" delivery between any pair of processes);
  ``fifo_links=False`` lets frames overtake each other on one link too;
* drop: each frame is lost with probability ``drop``;
* partition: peers in the ``cut`` set neither send nor receive (frames already in flight
  to or from them are dropped on arrival);
* lose a peer: a peer that ``detach``es (a process that died) receives nothing more; frames
  to it are dropped, as ZeroMQ drops what a ROUTER sends to a peer that is gone.

All randomness comes from the ``random.Random`` handed in by the runner.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from agora.sdk import codec
from agora.sdk.messages import Message

from support.sim.clock import EventQueue

__all__ = ["MASTER", "NetConfig", "Receiver", "SimNetwork", "TraceEntry"]

#: The master's name on the simulated network.
MASTER = "master"

#: ``receiver(sender, message, epoch)``
Receiver = Callable[[str, Message, int], None]

#: (time, what, source, destination, message name, crc32 of the frame)
TraceEntry = tuple[float, str, str, str, str, int]


@dataclass(slots=True)
class NetConfig:
    latency_min: float = 0.001
    latency_max: float = 0.020
    drop: float = 0.0
    fifo_links: bool = True


class SimNetwork:
    def __init__(self, queue: EventQueue, rng: random.Random, config: NetConfig) -> None:
        self.queue = queue
        self.rng = rng
        self.config = config
        self.cut: set[str] = set()
        self.trace: list[TraceEntry] = []
        self.sent = 0
        self.dropped = 0
        self._receivers: dict[str, Receiver] = {}
        self._last_arrival: dict[tuple[str, str], float] = {}
        self._gone: set[str] = set()
        #: ``gate(src, dst)``: whether ``dst`` takes a frame from ``src`` when it arrives (a
        #: client's link to a group of masters reads the one it follows only).
        self.gate: Callable[[str, str], bool] | None = None

    def attach(self, name: str, receiver: Receiver) -> None:
        if name in self._receivers:
            raise ValueError(f"peer {name!r} is already attached")
        self._receivers[name] = receiver
        self._gone.discard(name)

    def detach(self, name: str) -> None:
        """``name`` is gone (its process died); frames to it are dropped until it attaches again."""
        if self._receivers.pop(name, None) is not None:
            self._gone.add(name)

    def send(self, src: str, dst: str, message: Message, epoch: int = 0) -> None:
        frame = codec.encode(message, epoch=epoch)
        name = message.NAME
        now = self.queue.clock.now
        crc = zlib.crc32(frame)
        self.sent += 1
        if dst not in self._receivers:
            if dst in self._gone:
                self._drop(now, "gone", src, dst, name, crc)
                return
            raise AssertionError(f"{src} sent {name} to unknown peer {dst!r}")
        if src in self.cut or dst in self.cut:
            self._drop(now, "cut", src, dst, name, crc)
            return
        # Draw both numbers whatever happens, so a change of drop rate keeps latencies stable.
        lost = self.rng.random() < self.config.drop
        delay = self.rng.uniform(self.config.latency_min, self.config.latency_max)
        if lost:
            self._drop(now, "drop", src, dst, name, crc)
            return
        arrival = now + delay
        if self.config.fifo_links:
            link = (src, dst)
            arrival = max(arrival, self._last_arrival.get(link, 0.0))
            self._last_arrival[link] = arrival
        self.trace.append((now, "send", src, dst, name, crc))
        self.queue.at(arrival, lambda: self._arrive(src, dst, frame, crc), f"{src}->{dst} {name}")

    def _arrive(self, src: str, dst: str, frame: bytes, crc: int) -> None:
        envelope = codec.decode(frame)
        name = envelope.message.NAME
        now = self.queue.clock.now
        if src in self.cut or dst in self.cut:
            self._drop(now, "cut", src, dst, name, crc)
            return
        if dst not in self._receivers:
            self._drop(now, "gone", src, dst, name, crc)
            return
        if self.gate is not None and not self.gate(src, dst):
            self._drop(now, "stale", src, dst, name, crc)
            return
        self.trace.append((now, "recv", src, dst, name, crc))
        self._receivers[dst](src, envelope.message, envelope.epoch)

    def _drop(self, now: float, why: str, src: str, dst: str, name: str, crc: int) -> None:
        self.dropped += 1
        self.trace.append((now, why, src, dst, name, crc))
