"""A test scheduler: launches queued TaskSpecs on offers and records every event."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from agora.sdk import Filters, Offer, Scheduler, TaskSpec, TaskState, TaskStatus


@dataclass
class Recorder(Scheduler):
    """Launches ``todo`` on the first offers they fit, in order.

    ``hold_offers``: keep offers it has no use for (to watch them being rescinded) instead of
    declining them. ``refuse_seconds``: the filter on the unused part of an accepted offer.
    """

    todo: list[TaskSpec] = field(default_factory=list)
    hold_offers: bool = False
    refuse_seconds: float = 0.0
    statuses: list[TaskStatus] = field(default_factory=list)
    offers_seen: list[Offer] = field(default_factory=list)
    held: list[Offer] = field(default_factory=list)
    rescinded: list[str] = field(default_factory=list)
    lost_agents: list[str] = field(default_factory=list)
    messages: list[bytes] = field(default_factory=list)
    registrations: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # --- callbacks (driver thread) -----------------------------------------------------------
    def registered(self, driver, framework_id, master_info) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.registrations.append("registered")

    def reregistered(self, driver, master_info) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.registrations.append("reregistered")

    def offers(self, driver, offers: list[Offer]) -> None:  # type: ignore[no-untyped-def]
        for offer in offers:
            with self.lock:
                self.offers_seen.append(offer)
                tasks, free = [], offer.resources
                while self.todo and free.fits(self.todo[0].resources):  # type: ignore[arg-type]
                    spec = self.todo.pop(0)
                    tasks.append(spec)
                    free = free - spec.resources  # type: ignore[operator]
            if tasks:
                driver.launch(offer, tasks, filters=Filters(refuse_seconds=self.refuse_seconds))
            elif self.hold_offers:
                with self.lock:
                    self.held.append(offer)
            else:
                driver.decline(offer.offer_id, filters=Filters(refuse_seconds=1.0))

    def offer_rescinded(self, driver, offer_id) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.rescinded.append(str(offer_id))

    def status_update(self, driver, status: TaskStatus) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.statuses.append(status)

    def agent_lost(self, driver, agent_id) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.lost_agents.append(str(agent_id))

    def framework_message(self, driver, agent_id, executor_id, data: bytes) -> None:  # type: ignore[no-untyped-def]
        with self.lock:
            self.messages.append(data)

    # --- queries (test thread) -----------------------------------------------------------------
    def add(self, specs: Iterable[TaskSpec]) -> None:
        with self.lock:
            self.todo.extend(specs)

    def states(self, task_id: str) -> list[TaskState]:
        with self.lock:
            return [s.state for s in self.statuses if s.task_id == task_id]

    def last(self, task_id: str) -> TaskStatus | None:
        with self.lock:
            mine = [s for s in self.statuses if s.task_id == task_id]
        return mine[-1] if mine else None

    def wait_state(self, task_id: str, state: TaskState, timeout: float = 20.0) -> TaskStatus:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for s in self.statuses:
                    if s.task_id == task_id and s.state is state:
                        return s
            time.sleep(0.02)
        seen = [x.name for x in self.states(task_id)]
        raise AssertionError(f"task {task_id} never reached {state.name}; saw {seen}")
