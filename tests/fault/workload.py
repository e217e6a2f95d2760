"""The fault suite's workload: one framework built only on the public scheduler SDK.

    python tests/fault/workload.py --master M --name fw1 --history FILE --tasks N --seconds S

It registers (``failover_timeout`` 300 s), launches tasks named ``<name>-<n>`` (small cpus/mem,
one port when the offer has ports, ``sleep 0.NNN`` through ``sh -c``) on the offers it gets,
acknowledges every update itself (implicit acknowledgements off, so ``ack`` is recorded where the
acknowledgement is really made), and reconciles its unfinished tasks now and then, so a launch
lost in a failover comes back as an update.

It writes to the history (kinds of :mod:`agora.sdk.daemon.history`, plus ``registered`` and
``teardown``): ``registered`` (framework id, name, epoch) on every SUBSCRIBED; ``offer`` (epoch of
the master that sent it) per batch; ``received`` per update (uuid null for reconciliation
answers); ``ack`` right after ``driver.acknowledge``; ``teardown`` before tearing itself down.

With ``--trap-tasks K`` it first launches K long tasks (``<name>-trap-<k>``) whose TERM trap
takes half a second to write ``<marker dir>/<task>.cleaned`` and exit; once the file
``--kill-trigger`` exists it kills them (``kill`` in the history), and kills again on every
reconciliation until each has ended. ``--failover-timeout`` sets the framework's (0 is the SDK's and
Mesos's default: removal as soon as it disconnects from a leader it subscribed with).

With CURVE on, it connects with ``--curve-secret-key`` and ``--curve-server-key`` (by default
``$AGORA_CURVE_SECRET_KEY`` and ``$AGORA_CURVE_SERVER_KEY``, as the ``agora`` CLI), else with the
keys the SDK finds itself (``$AGORA_HOME/keys``).

It stops launching when N tasks are launched or S seconds have passed, then waits up to
``--drain`` seconds for its tasks to end. All ended: it makes sure its last acknowledgements
reached the master (an explicit reconciliation is answered after them) and leaves with failover,
so every update must have been received and acked (I5). Otherwise it records ``teardown`` and
tears the framework down. Exit status: 0 done, 3 never subscribed within S seconds, 4 the master
ended the subscription. A JSON summary goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from agora.sdk.daemon.history import History
from agora.sdk.messages import FrameworkInfo, MasterInfo, Offer, TaskStatus, is_terminal
from agora.sdk.resources import Resources
from agora.sdk.scheduler import BlockingSchedulerDriver, DriverError, Scheduler, TaskSpec
from agora.sdk.transport import CurveClient

log = structlog.get_logger(__name__)

FAILOVER_TIMEOUT = 300.0
#: A trap task: on TERM it takes half a second to clean up (write its marker), then exits 0.
TRAP_COMMAND = "trap 'sleep 0.5; echo cleaned > {marker}; exit 0' TERM; while :; do sleep 0.1; done"
TRAP_SHAPE = Resources.parse("cpus:0.1;mem:8")
#: How often the kill trigger is looked for.
TRIGGER_POLL = 0.1
#: How long to wait for the reconciliation answer that confirms the last acks went out.
BARRIER_TIMEOUT = 5.0


class Workload(Scheduler):
    """Launches ``tasks`` uniquely named tasks and acknowledges every update it gets."""

    def __init__(
        self,
        name: str,
        history: History,
        tasks: int,
        shape: Resources,
        seed: int,
        ports: bool,
        traps: list[str] | None = None,
        marker_dir: Path | None = None,
    ) -> None:
        self.name, self.history, self.tasks, self.shape = name, history, tasks, shape
        self.rng = random.Random(seed)
        self.ports = ports
        #: Trap tasks not launched yet; where their TERM traps leave their markers.
        self.traps = list(traps or [])
        self.marker_dir = marker_dir
        self.killing: set[str] = set()
        self.lock = threading.Lock()
        self.states: dict[str, str] = {}  # task id -> latest state ("" until the first update)
        self.ended: set[str] = set()
        self.launching = True
        self.offers_seen = 0
        self.updates = 0
        self.all_ended = threading.Event()
        self.barrier: str | None = None
        self.barrier_answered = threading.Event()

    # ----------------------------------------------------------------- callbacks

    def registered(self, driver: Any, framework_id: Any, master_info: MasterInfo) -> None:
        self._subscribed(str(framework_id), master_info)

    def reregistered(self, driver: Any, master_info: MasterInfo) -> None:
        self._subscribed(str(driver.framework_id), master_info)

    def _subscribed(self, framework_id: str, info: MasterInfo) -> None:
        self.history.record("registered", framework=framework_id, name=self.name, epoch=info.epoch)
        log.info("workload_subscribed", framework_id=framework_id, epoch=info.epoch)

    def offers(self, driver: Any, offers: list[Offer]) -> None:
        info: MasterInfo | None = driver.master_info
        self.history.record(
            "offer",
            epoch=info.epoch if info is not None else None,
            offers=len(offers),
            agents=sorted({str(o.agent_id) for o in offers}),
        )
        for offer in offers:
            driver.launch(offer, self._fill(offer))  # nothing to launch declines it

    def _fill(self, offer: Offer) -> list[TaskSpec]:
        specs: list[TaskSpec] = []
        free = offer.resources
        with self.lock:
            self.offers_seen += 1
            while self.traps and free.fits(TRAP_SHAPE) and self.marker_dir is not None:
                task_id = self.traps.pop(0)
                marker = shlex.quote(str(self.marker_dir / f"{task_id}.cleaned"))
                command = TRAP_COMMAND.format(marker=marker)
                specs.append(TaskSpec(task_id, command, TRAP_SHAPE))
                self.states[task_id] = ""
                free -= TRAP_SHAPE
            while self.launching and len(self.states) < self.tasks:
                need = self.shape
                ranges = free.ranges("ports")
                if self.ports and ranges:
                    port = ranges[0][0]
                    need = need + Resources.parse(f"ports:[{port}-{port}]")
                if not free.fits(need):
                    break
                task_id = f"{self.name}-{len(self.states)}"
                command = f"sleep 0.{self.rng.randrange(1000):03d}"
                specs.append(TaskSpec(task_id, command, need))
                self.states[task_id] = ""
                free -= need
            if len(self.states) >= self.tasks:
                self.launching = False
        return specs

    def status_update(self, driver: Any, status: TaskStatus) -> None:
        task = str(status.task_id)
        uuid = status.uuid.hex() if status.uuid is not None else None
        self.history.record(
            "received",
            task=task,
            uuid=uuid,
            state=status.state.value,
            agent=str(status.agent_id) if status.agent_id is not None else None,
        )
        if status.uuid is not None and status.agent_id is not None:
            driver.acknowledge(status)
            self.history.record("ack", task=task, uuid=uuid)
        with self.lock:
            self.updates += 1
            if task in self.states and task not in self.ended:  # a final state stays final
                self.states[task] = status.state.value
                if is_terminal(status.state):
                    self.ended.add(task)
            if not self.launching and len(self.ended) == len(self.states):
                self.all_ended.set()
            if uuid is None and task == self.barrier:
                self.barrier_answered.set()

    # ----------------------------------------------------------------- main thread

    def kill_traps(self, driver: BlockingSchedulerDriver) -> None:
        """Kill every trap task (again) that has not ended yet."""
        with self.lock:
            pending = sorted(t for t in self.killing if t not in self.ended)
        for task in pending:
            self.history.record("kill", task=task)
            driver.kill(task)

    def stop_launching(self) -> None:
        with self.lock:
            self.launching = False
            if len(self.ended) == len(self.states):
                self.all_ended.set()

    def unfinished(self) -> list[str]:
        with self.lock:
            return sorted(t for t in self.states if t not in self.ended)

    def summary(self) -> dict[str, Any]:
        with self.lock:
            counts: dict[str, int] = {}
            for state in self.states.values():
                counts[state or "NO_UPDATE"] = counts.get(state or "NO_UPDATE", 0) + 1
            return {
                "name": self.name,
                "launched": len(self.states),
                "ended": len(self.ended),
                "states": counts,
                "offer_batches": self.offers_seen,
                "updates": self.updates,
            }


def _wait(
    event: threading.Event,
    until: float,
    driver: BlockingSchedulerDriver,
    w: Workload,
    reconcile_every: float,
    trigger: Path | None = None,
) -> bool:
    """Wait for ``event`` until monotonic ``until``, reconciling unfinished tasks meanwhile (and
    killing the trap tasks once ``trigger`` exists, again at every reconciliation)."""
    next_reconcile = time.monotonic() + reconcile_every
    while not event.is_set():
        now = time.monotonic()
        if now >= until:
            return False
        if trigger is not None and not w.killing and trigger.exists():
            with w.lock:
                w.killing = {t for t in w.states if "-trap-" in t}
            w.kill_traps(driver)
        if now >= next_reconcile:
            pending = w.unfinished()
            if pending:
                driver.reconcile(pending)
            w.kill_traps(driver)
            next_reconcile = now + reconcile_every
        event.wait(min(until, next_reconcile, now + TRIGGER_POLL) - now)
    return True


def _curve(args: argparse.Namespace) -> CurveClient | None:
    """The keys given (both or neither), loaded; None: the driver looks for its own."""
    if bool(args.curve_secret_key) != bool(args.curve_server_key):
        raise SystemExit("give both --curve-secret-key and --curve-server-key, or neither")
    if not args.curve_secret_key:
        return None
    return CurveClient(args.curve_secret_key, args.curve_server_key)


def run(args: argparse.Namespace) -> int:
    history = History(args.history, args.name)
    shape = Resources.parse(f"cpus:{args.cpus};mem:{args.mem}")
    traps = [f"{args.name}-trap-{k}" for k in range(args.trap_tasks)]
    w = Workload(
        args.name, history, args.tasks, shape, args.seed, not args.no_ports, traps, args.marker_dir
    )
    trigger = args.kill_trigger
    driver = BlockingSchedulerDriver(
        w,
        FrameworkInfo(name=args.name, failover_timeout=args.failover_timeout),
        args.master,
        implicit_acknowledgements=False,
        heartbeat_interval=1.0,
        curve=_curve(args),
    )
    began = time.monotonic()
    status, how = 0, "failover"
    try:
        framework_id = str(driver.start(timeout=args.seconds))
    except TimeoutError:
        print(json.dumps({**w.summary(), "exit": "never subscribed"}))
        return 3
    except DriverError as exc:
        print(json.dumps({**w.summary(), "exit": f"refused: {exc}"}))
        return 4
    try:
        _wait(w.all_ended, began + args.seconds, driver, w, args.reconcile, trigger)
        w.stop_launching()
        drained = _wait(
            w.all_ended, time.monotonic() + args.drain, driver, w, args.reconcile, trigger
        )
        if drained:
            # An answer to this reconciliation comes after the acknowledgements queued before it.
            last = next(iter(sorted(w.states)), None)
            if last is not None:
                with w.lock:
                    w.barrier = last
                driver.reconcile([last])
                w.barrier_answered.wait(BARRIER_TIMEOUT)
            driver.stop(failover=True)
        else:
            how = "teardown"
            history.record("teardown", framework=framework_id, name=args.name)
            driver.stop()
        driver.join(timeout=10.0)
    except DriverError as exc:
        how, status = f"refused: {exc}", 4
    except TimeoutError:
        how = "driver did not stop"
    finally:
        history.close()
    took = round(time.monotonic() - began, 3)
    print(json.dumps({**w.summary(), "framework_id": framework_id, "exit": how, "seconds": took}))
    return status


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Agora fault-suite workload framework.")
    p.add_argument("--master", default=None, help="endpoint (a comma-separated list is passed on)")
    p.add_argument("--name", required=True, help="framework name; task ids are <name>-<n>")
    p.add_argument("--history", default=None, help="JSONL history file to append to")
    p.add_argument("--tasks", type=int, required=True, help="how many tasks to launch")
    p.add_argument("--seconds", type=float, required=True, help="stop launching after this")
    p.add_argument("--drain", type=float, default=10.0, help="then wait this long for tasks")
    p.add_argument("--cpus", type=float, default=0.05)
    p.add_argument("--mem", type=float, default=8)
    p.add_argument("--seed", type=int, default=0, help="seeds the tasks' sleep times")
    p.add_argument("--reconcile", type=float, default=3.0, help="seconds between reconciliations")
    p.add_argument("--no-ports", action="store_true", help="do not take a port per task")
    p.add_argument("--failover-timeout", type=float, default=FAILOVER_TIMEOUT)
    p.add_argument("--trap-tasks", type=int, default=0, help="long tasks with a TERM trap")
    p.add_argument("--marker-dir", type=Path, default=None, help="where their traps write")
    p.add_argument("--kill-trigger", type=Path, default=None, help="kill them once this exists")
    p.add_argument(
        "--curve-secret-key",
        default=os.environ.get("AGORA_CURVE_SECRET_KEY") or None,
        help="this framework's CURVE secret key file (default: $AGORA_CURVE_SECRET_KEY)",
    )
    p.add_argument(
        "--curve-server-key",
        default=os.environ.get("AGORA_CURVE_SERVER_KEY") or None,
        help="the masters' CURVE public key file (default: $AGORA_CURVE_SERVER_KEY)",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
