"""Wire codec benchmark: encode + decode round trips of three typical frames.

    .venv/bin/python tests/bench/codec.py [--iterations 20000]

* ``status_update_us`` — STATUS_UPDATE (agent -> master) carrying one RUNNING TaskStatus.
* ``offers10_us`` — OFFERS with 10 offers, each ``cpus;mem;disk;ports`` and one attribute.
* ``accept_launch_us`` — ACCEPT of two offers with one LAUNCH of a task with a command.

Each figure is the best of five runs of ``encode`` then ``decode`` of the message, per round trip,
in microseconds (``time.perf_counter``). The ``*_enc_us`` / ``*_dec_us`` figures split it. Prints
one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from agora.sdk.codec import decode, encode
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    CommandInfo,
    Filters,
    Launch,
    Message,
    Offer,
    Offers,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources

FW = FrameworkID("2b1c6f0e-framework-0001")
AGENT = AgentID("5d9e7a31-agent-0001")


def status_update() -> Message:
    status = TaskStatus(
        task_id=TaskID("task-000001"),
        state=TaskState.RUNNING,
        source=StatusSource.EXECUTOR,
        agent_id=AGENT,
        executor_id=ExecutorID("task-000001"),
        uuid=b"0123456789abcdef",
        timestamp=1.7e9,
    )
    return StatusUpdateMessage(update=StatusUpdate(framework_id=FW, status=status))


def offers(n: int = 10) -> Message:
    res = Resources.parse("cpus:8;mem:16384;disk:100000;ports:[31000-32000]")
    return Offers(
        offers=tuple(
            Offer(
                offer_id=OfferID(f"offer-{i:06d}"),
                framework_id=FW,
                agent_id=AgentID(f"agent-{i:04d}"),
                hostname=f"host-{i}.example",
                role="*",
                resources=res,
                attributes={"rack": f"r{i % 4}"},
            )
            for i in range(n)
        )
    )


def accept_launch() -> Message:
    task = TaskInfo(
        task_id=TaskID("task-000001"),
        name="task-000001",
        agent_id=AGENT,
        resources=Resources.parse("cpus:0.1;mem:32"),
        command=CommandInfo(value="true"),
    )
    return Accept(
        framework_id=FW,
        offer_ids=(OfferID("offer-000001"), OfferID("offer-000002")),
        operations=(Launch(task_infos=(task,)),),
        filters=Filters(refuse_seconds=5.0),
    )


def _best_us(fn: Callable[[], object], iterations: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        best = min(best, (time.perf_counter() - start) / iterations)
    return round(best * 1e6, 2)


def measure(name: str, message: Message, iterations: int) -> dict[str, float]:
    frame = encode(message, epoch=3)
    assert decode(frame).message == message
    return {
        f"{name}_us": _best_us(lambda: decode(encode(message, epoch=3)), iterations),
        f"{name}_enc_us": _best_us(lambda: encode(message, epoch=3), iterations),
        f"{name}_dec_us": _best_us(lambda: decode(frame), iterations),
        f"{name}_bytes": len(frame),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args(argv)
    n = args.iterations
    out: dict[str, object] = {"bench": "codec", "python": sys.version.split()[0]}
    out.update(measure("status_update", status_update(), n))
    out.update(measure("offers10", offers(), max(1, n // 10)))
    out.update(measure("accept_launch", accept_launch(), n))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
