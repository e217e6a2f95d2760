"""The scheduler driver's protocol state, sans I/O: what the driver knows and decides, with no
sockets, tasks, threads or clocks.

:class:`SchedulerCore` holds the subscription (framework id, master, whether it is subscribed,
which connection it was made on), the offers the framework holds, the suppressed roles and the
calls queued for the master. The asyncio driver (:mod:`agora.sdk.scheduler.driver`) feeds it
what happens — a frame received, the link up or down, a call made — and performs what it
answers: messages to send, callbacks to run, a re-subscription, a stop. Every decision lives
here, so it is tested without a master (``tests/unit/test_scheduler_core.py``).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Sequence

from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    Accept,
    AcceptInverseOffers,
    Acknowledge,
    Decline,
    DeclineInverseOffers,
    Error,
    ErrorCode,
    ExecutorInfo,
    Filters,
    FrameworkInfo,
    GangRequest,
    InverseOffer,
    Kill,
    Launch,
    LaunchGroup,
    MasterInfo,
    Message,
    Offer,
    Operation,
    Reconcile,
    ReconcileTask,
    Request,
    Revive,
    SendMessage,
    Shutdown,
    Subscribe,
    Subscribed,
    Suppress,
    TaskGroupInfo,
    TaskInfo,
    TaskStatus,
)
from agora.sdk.messages.batching import BATCHES, FEATURES, coalesce
from agora.sdk.messages.common import MAX_BATCH_ITEMS
from agora.sdk.scheduler._guard import checked
from agora.sdk.scheduler.calls import OfferRef, Offers_
from agora.sdk.scheduler.spec import TaskSpec, task_infos_for
from msgspec.structs import replace

__all__ = ["ErrorVerdict", "SchedulerCore"]

#: Refusals meaning "subscribe again" once the framework has been registered.
_RESUBSCRIBE = frozenset(
    {ErrorCode.NOT_SUBSCRIBED, ErrorCode.UNKNOWN_FRAMEWORK, ErrorCode.NOT_LEADER}
)


class ErrorVerdict(enum.Enum):
    """What an ERROR from the master means for the driver."""

    #: Tell the scheduler (``error``) and carry on.
    REPORT = "report"
    #: Tell the scheduler, then stop: the subscription is over (``DriverError``).
    FATAL = "fatal"
    #: The master forgot the framework, or leads no more: subscribe again (nothing to report).
    RESUBSCRIBE = "resubscribe"
    #: A refusal of a call made before the driver re-subscribed on a new connection: stale.
    STALE = "stale"


class SchedulerCore:
    """One framework's protocol state (see the module docstring)."""

    def __init__(self, info: FrameworkInfo, *, implicit_acknowledgements: bool = True) -> None:
        self.info = info
        self.implicit = implicit_acknowledgements
        self.framework_id: FrameworkID | None = info.framework_id
        self.master_info: MasterInfo | None = None
        self.subscribed = False
        #: SUBSCRIBED has arrived at least once (the framework is registered).
        self.registered_once = False
        #: Offers the framework holds, by id, as the master sent them.
        self.offers: dict[OfferID, Offer] = {}
        #: Inverse offers not answered yet, by id (maintenance coming on those agents).
        self.inverse_offers: dict[str, InverseOffer] = {}
        #: Roles suppressed; kept across re-subscription (sent with every SUBSCRIBE).
        self.suppressed: set[str] = set()
        #: Calls for the master, in the order they were made.
        self.outbox: deque[Message] = deque()
        #: The newest master epoch seen: a message of an older one is stale.
        self.newest_epoch = 0
        #: Connections so far, the one SUBSCRIBED last arrived on, the one the last SUBSCRIBE
        #: went out on (tells a stale refusal from a real one, and a queued SUBSCRIBE).
        self.connection = 0
        self.subscribed_on = 0
        self.subscribe_sent_on = -1

    # ------------------------------------------------------------------ the link

    def connection_lost(self) -> bool:
        """The link went down; True if the framework was subscribed (``disconnected`` is due)."""
        self.connection += 1
        return self.lost()

    def lost(self) -> bool:
        """The subscription is gone (link down, master silent, master forgot us); True if it
        was live, so the scheduler is to be told."""
        was = self.subscribed
        self.subscribed = False
        return was

    def subscribe_pending(self, connected: bool) -> bool:
        """The last SUBSCRIBE is queued for a connection still coming: do not send another."""
        return not connected and self.subscribe_sent_on == self.connection

    def subscribe(self) -> Subscribe:
        """The SUBSCRIBE to send now (with the framework id once known)."""
        info = self.info
        if self.framework_id is not None:
            info = replace(info, framework_id=self.framework_id)
        self.subscribe_sent_on = self.connection
        return Subscribe(
            framework_info=info,
            suppressed_roles=tuple(sorted(self.suppressed)),
            features=FEATURES,
        )

    # ------------------------------------------------------------------ receiving

    def fresh(self, epoch: int) -> bool:
        """Whether a message of ``epoch`` may be acted on (a deposed master's may not)."""
        if epoch < self.newest_epoch:
            return False
        self.newest_epoch = epoch
        return True

    def on_subscribed(self, m: Subscribed) -> tuple[bool, bool, list[OfferID]]:
        """SUBSCRIBED: (first registration, re-registration after a loss, the offers it voided:
        the master closed every offer of the previous subscription)."""
        was = self.subscribed
        self.framework_id = m.framework_id
        self.master_info = m.master_info
        self.subscribed = True
        self.subscribed_on = self.connection
        voided = list(self.offers)
        self.offers.clear()
        first = not self.registered_once
        self.registered_once = True
        return first, not first and not was, voided

    def on_offers(self, offers: Iterable[Offer]) -> None:
        for offer in offers:
            self.offers[offer.offer_id] = offer

    def on_rescind(self, offer_id: OfferID) -> None:
        self.offers.pop(offer_id, None)

    def on_inverse_offers(self, inverse_offers: Iterable[InverseOffer]) -> None:
        for io in inverse_offers:
            self.inverse_offers[io.inverse_offer_id] = io

    def on_rescind_inverse_offer(self, inverse_offer_id: str) -> None:
        self.inverse_offers.pop(inverse_offer_id, None)

    def still_held(self, offers: Iterable[Offer]) -> list[OfferID]:
        """Which of ``offers`` the framework has neither used nor declined."""
        return [o.offer_id for o in offers if o.offer_id in self.offers]

    def acknowledged(self, status: TaskStatus) -> None:
        """The scheduler has seen ``status``: queue its acknowledgement (implicit mode)."""
        if self.implicit and status.uuid is not None and status.agent_id is not None:
            fid = self.framework_id
            if fid is not None:
                self.outbox.append(
                    Acknowledge(
                        framework_id=fid,
                        agent_id=status.agent_id,
                        task_id=status.task_id,
                        uuid=status.uuid,
                    )
                )

    def error_verdict(self, m: Error) -> ErrorVerdict:
        code = m.code
        if code is ErrorCode.FRAMEWORK_REMOVED:
            return ErrorVerdict.FATAL
        if code is ErrorCode.FORBIDDEN:
            if self.registered_once and self.connection != self.subscribed_on:
                return ErrorVerdict.STALE
            return ErrorVerdict.FATAL  # subscription forbidden, or replaced by another scheduler
        if code is ErrorCode.BAD_REQUEST and not self.registered_once:
            return ErrorVerdict.FATAL  # the SUBSCRIBE itself was refused
        if code in _RESUBSCRIBE and self.registered_once:
            return ErrorVerdict.RESUBSCRIBE
        return ErrorVerdict.REPORT

    # ------------------------------------------------------------------ sending

    def next_call(self) -> Message | None:
        """The next message to send; a run of acknowledgements goes as one to a master that
        reads batches. They overtake the other calls queued between them, which keep their
        order: an update acknowledged a little earlier is never wrong, and a scheduler that
        launches as its tasks end interleaves its ACCEPTs with them."""
        out = self.outbox
        if not out:
            return None
        first = out.popleft()
        info = self.master_info
        if (
            type(first) is not Acknowledge
            or not out
            or info is None
            or BATCHES not in info.features
        ):
            return first
        acks: list[Message] = [first]
        others: list[Message] = []
        while out and len(acks) < MAX_BATCH_ITEMS:
            message = out.popleft()
            (acks if type(message) is Acknowledge else others).append(message)
        out.extendleft(reversed(others))
        (merged,) = coalesce(acks)
        return merged

    # ------------------------------------------------------------------ calls

    def _fid(self) -> FrameworkID:
        fid = self.framework_id
        if fid is None:
            raise RuntimeError("the driver has not subscribed yet (no framework id)")
        return fid

    def _queue(self, call: Message, uses: Iterable[OfferID] = ()) -> Message:
        """Queue ``call`` once it is known to be sendable (ValueError otherwise, and nothing
        changes: no offer is used up)."""
        checked(call)
        self.outbox.append(call)
        for offer_id in uses:
            self.offers.pop(offer_id, None)
        return call

    def _resolve(self, offers: Offers_) -> tuple[list[OfferID], list[Offer] | None]:
        """Offer ids, and the Offer records when every one is known (else None)."""
        items: Sequence[OfferRef]
        items = [offers] if isinstance(offers, Offer | str) else list(offers)
        ids: list[OfferID] = []
        records: list[Offer] | None = []
        for item in items:
            if isinstance(item, Offer):
                ids.append(item.offer_id)
                if records is not None:
                    records.append(item)
            else:
                offer_id = OfferID(item)
                ids.append(offer_id)
                known = self.offers.get(offer_id)
                if known is None:
                    records = None
                elif records is not None:
                    records.append(known)
        return ids, records

    def _infos(
        self, records: list[Offer] | None, tasks: Sequence[TaskSpec | TaskInfo]
    ) -> list[TaskInfo]:
        if any(isinstance(t, TaskSpec) for t in tasks):
            if records is None:
                raise ValueError("launching TaskSpecs needs the offers (unknown offer id given)")
            _, infos = task_infos_for(records, tasks)
            return infos
        return [t for t in tasks if isinstance(t, TaskInfo)]

    def launch(
        self, offers: Offers_, tasks: Sequence[TaskSpec | TaskInfo], filters: Filters | None
    ) -> Message:
        fid = self._fid()
        ids, records = self._resolve(offers)
        infos = self._infos(records, tasks)
        operations: tuple[Operation, ...] = (Launch(task_infos=tuple(infos)),) if infos else ()
        accept = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=operations,
            filters=filters or Filters(),
        )
        return self._queue(accept, ids)

    def launch_group(
        self,
        offers: Offers_,
        executor: ExecutorInfo,
        tasks: Sequence[TaskSpec | TaskInfo],
        filters: Filters | None,
    ) -> Message:
        fid = self._fid()
        if not executor.framework_id:
            executor = replace(executor, framework_id=fid)
        ids, records = self._resolve(offers)
        infos = self._infos(records, tasks)
        group = TaskGroupInfo(tasks=tuple(replace(t, executor=None) for t in infos))
        operation = LaunchGroup(executor=executor, task_group=group)
        accept = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=(operation,),
            filters=filters or Filters(),
        )
        return self._queue(accept, ids)

    def accept(
        self, offer_ids: Offers_, operations: Sequence[Operation], filters: Filters | None
    ) -> Message:
        fid = self._fid()
        ids, _ = self._resolve(offer_ids)
        accept = Accept(
            framework_id=fid,
            offer_ids=tuple(ids),
            operations=tuple(operations),
            filters=filters or Filters(),
        )
        return self._queue(accept, ids)

    def decline(self, offer_ids: Offers_, filters: Filters | None) -> Message:
        fid = self._fid()
        ids, _ = self._resolve(offer_ids)
        return self._queue(
            Decline(framework_id=fid, offer_ids=tuple(ids), filters=filters or Filters()), ids
        )

    def revive(self, roles: Sequence[str]) -> Message:
        call = self._queue(Revive(framework_id=self._fid(), roles=tuple(roles)))
        if roles:
            self.suppressed.difference_update(roles)
        else:
            self.suppressed.clear()
        return call

    def suppress(self, roles: Sequence[str]) -> Message:
        call = self._queue(Suppress(framework_id=self._fid(), roles=tuple(roles)))
        self.suppressed.update(roles or self.info.roles)
        return call

    def kill(self, task_id: TaskID | str, agent_id: AgentID | str | None, kill_id: str) -> Message:
        agent = AgentID(agent_id) if agent_id is not None else None
        return self._queue(
            Kill(framework_id=self._fid(), task_id=TaskID(task_id), agent_id=agent, kill_id=kill_id)
        )

    def shutdown_executor(self, agent_id: AgentID | str, executor_id: ExecutorID | str) -> Message:
        return self._queue(
            Shutdown(
                framework_id=self._fid(),
                executor_id=ExecutorID(executor_id),
                agent_id=AgentID(agent_id),
            )
        )

    def acknowledge(self, status: TaskStatus) -> Message:
        fid = self._fid()
        if status.uuid is None or status.agent_id is None:
            raise ValueError("only updates with a uuid and an agent id are acknowledged")
        return self._queue(
            Acknowledge(
                framework_id=fid, agent_id=status.agent_id, task_id=status.task_id, uuid=status.uuid
            )
        )

    def reconcile(self, tasks: Sequence[TaskID | str | ReconcileTask | TaskStatus]) -> Message:
        fid = self._fid()
        items: list[ReconcileTask] = []
        for t in tasks:
            if isinstance(t, ReconcileTask):
                items.append(t)
            elif isinstance(t, TaskStatus):
                items.append(ReconcileTask(task_id=t.task_id, agent_id=t.agent_id))
            else:
                items.append(ReconcileTask(task_id=TaskID(t)))
        return self._queue(Reconcile(framework_id=fid, tasks=tuple(items)))

    def message(
        self, agent_id: AgentID | str, executor_id: ExecutorID | str, data: bytes
    ) -> Message:
        return self._queue(
            SendMessage(
                framework_id=self._fid(),
                agent_id=AgentID(agent_id),
                executor_id=ExecutorID(executor_id),
                data=bytes(data),
            )
        )

    def answer_inverse_offers(
        self, inverse_offers: Sequence[InverseOffer | str], accept: bool
    ) -> Message:
        """ACCEPT_INVERSE_OFFERS (will vacate) or DECLINE_INVERSE_OFFERS; an answered inverse
        offer is no longer held (the master may send it again, and it may be answered again)."""
        ids = tuple(
            io.inverse_offer_id if isinstance(io, InverseOffer) else str(io)
            for io in inverse_offers
        )
        if not ids:
            raise ValueError("no inverse offers given")
        kind = AcceptInverseOffers if accept else DeclineInverseOffers
        call = self._queue(kind(framework_id=self._fid(), inverse_offer_ids=ids))
        for inverse_offer_id in ids:
            self.inverse_offers.pop(inverse_offer_id, None)
        return call

    def request(self, gangs: Sequence[GangRequest]) -> Message:
        return self._queue(Request(framework_id=self._fid(), gangs=tuple(gangs)))
