"""Random operation sequences against the allocator, checked against a simple model.

Invariants after every step:
* per agent, available + everything the model says is allocated there == the agent's total
  (so no resource is ever in two outstanding allocations, and nothing leaks);
* ``allocated(fw)`` is exactly what the model accumulated from the offers and gang parts;
* earmarks are a part of what is available; shares are never negative;
* at most one outstanding offer per (agent, framework, role); gang parts are slots x shape.
"""

from __future__ import annotations

from agora.master.allocator import (
    Allocation,
    Allocator,
    AllocatorConfig,
    AllocatorError,
    GangAllocation,
)
from agora.sdk.ids import AgentID, FrameworkID, GangID
from agora.sdk.messages import GangRequest, Placement
from agora.sdk.resources import Resources
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

R = Resources.parse
EMPTY = Resources()
ROLES = ("*", "gold", "silver")
SHAPES = (
    "cpus:4;mem:4096;ports:[31000-31005]",
    "cpus:2;mem:1024;cpus(gold):2;mem(gold):512",
    "cpus:8;mem:2048;disk:100",
    "cpus:1;mem:64;cpus(silver):1;ports(silver):[1-3]",
)
GANG_SHAPES = ("cpus:1", "cpus:1;mem:512", "cpus:2;mem:1024", "cpus:4")

_Key = tuple[FrameworkID, AgentID, str]


class AllocatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.a = Allocator(AllocatorConfig(seed=5))
        self.totals: dict[AgentID, Resources] = {}
        self.known: set[FrameworkID] = set()
        self.roles: dict[FrameworkID, frozenset[str]] = {}
        self.seen: set[FrameworkID] = set()
        self.model: dict[_Key, Resources] = {}
        self.outstanding: set[_Key] = set()
        self.gang_ids = 0

    # ------------------------------------------------------------------ helpers

    def _take(self, fw: FrameworkID, agent: AgentID, role: str, res: Resources) -> None:
        key = (fw, agent, role)
        self.model[key] = self.model.get(key, EMPTY) + res
        self.seen.add(fw)

    def _drop(self, keep: object) -> None:
        self.model = {k: v for k, v in self.model.items() if keep(k)}  # type: ignore[operator]
        self.outstanding = {k for k in self.outstanding if keep(k)}  # type: ignore[operator]

    # ------------------------------------------------------------------ rules

    @initialize(shapes=st.lists(st.sampled_from(SHAPES), min_size=2, max_size=4))
    def start(self, shapes: list[str]) -> None:
        for i, shape in enumerate(shapes):
            self.add_agent(i, shape, 0, "*", with_used=False)
        self.add_framework(0, {"*", "gold"}, set())
        self.add_framework(1, {"*", "silver"}, set())

    @rule(
        i=st.integers(0, 5),
        shape=st.sampled_from(SHAPES),
        fw=st.integers(0, 4),
        role=st.sampled_from(ROLES),
        with_used=st.booleans(),
    )
    def add_agent(self, i: int, shape: str, fw: int, role: str, with_used: bool) -> None:
        agent = AgentID(f"a{i}")
        if agent in self.totals:
            return
        total = R(shape)
        used = {}
        piece = total.allocatable_to(role).flatten(role) if role != "*" else R("cpus:1;mem:64")
        if with_used and total.contains(piece) and piece:
            used[(FrameworkID(f"f{fw}"), role)] = piece
        self.a.add_agent(agent, total, self.now, used=used)
        self.totals[agent] = total
        for (framework_id, r), res in used.items():
            self._take(framework_id, agent, r, res)

    @rule(i=st.integers(0, 5))
    def remove_agent(self, i: int) -> None:
        agent = AgentID(f"a{i}")
        self.a.remove_agent(agent)
        self.totals.pop(agent, None)
        self._drop(lambda k: k[1] != agent)

    @rule(i=st.integers(0, 5), active=st.booleans())
    def set_agent_active(self, i: int, active: bool) -> None:
        agent = AgentID(f"a{i}")
        if agent in self.totals:
            self.a.set_agent_active(agent, active)

    @rule(
        j=st.integers(0, 4),
        roles=st.sets(st.sampled_from(ROLES), min_size=1),
        suppressed=st.sets(st.sampled_from(ROLES)),
    )
    def add_framework(self, j: int, roles: set[str], suppressed: set[str]) -> None:
        fw = FrameworkID(f"f{j}")
        if fw in self.known:
            return
        self.a.add_framework(fw, roles, self.now, suppressed_roles=suppressed)
        self.known.add(fw)
        self.roles[fw] = frozenset(roles)
        self.seen.add(fw)

    @rule(j=st.integers(0, 4))
    def remove_framework(self, j: int) -> None:
        fw = FrameworkID(f"f{j}")
        self.a.remove_framework(fw)
        self.known.discard(fw)
        self._drop(lambda k: k[0] != fw)

    @rule(j=st.integers(0, 4), active=st.booleans())
    def set_framework_active(self, j: int, active: bool) -> None:
        fw = FrameworkID(f"f{j}")
        if fw in self.known:
            self.a.set_framework_active(fw, active)

    @rule(
        j=st.integers(0, 4),
        roles=st.none() | st.sets(st.sampled_from(ROLES)),
        suppress=st.booleans(),
    )
    def suppress_or_revive(self, j: int, roles: set[str] | None, suppress: bool) -> None:
        fw = FrameworkID(f"f{j}")
        if fw in self.known:
            if suppress:
                self.a.suppress(fw, roles)
            else:
                self.a.revive(fw, roles)

    @rule(role=st.sampled_from(ROLES), weight=st.sampled_from([0.5, 1, 3]))
    def set_weight(self, role: str, weight: float) -> None:
        self.a.set_weight(role, weight)

    @rule(
        role=st.sampled_from(ROLES),
        guarantee=st.sampled_from(["", "cpus:2", "cpus:4;mem:1024"]),
        limit=st.sampled_from([None, "cpus:6", "cpus:12;mem:8192"]),
    )
    def set_quota(self, role: str, guarantee: str, limit: str | None) -> None:
        self.a.set_quota(role, R(guarantee), None if limit is None else R(limit))

    @rule(dt=st.sampled_from([0.0, 0.5, 3.0, 20.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    @rule(full=st.booleans(), which=st.sets(st.integers(0, 6), max_size=3))
    def allocate(self, full: bool, which: set[int]) -> None:
        ids = None if full else [AgentID(f"a{i}") for i in sorted(which)]
        result = self.a.allocate(self.now, ids)
        new: list[_Key] = []
        for item in result:
            parts = item.parts if isinstance(item, GangAllocation) else (item,)
            if isinstance(item, GangAllocation):
                assert len({p.agent_id for p in parts}) == len(parts)
            for o in parts:
                assert isinstance(o, Allocation)
                assert o.resources
                assert o.framework_id in self.known
                assert o.role in self.roles[o.framework_id]
                assert self.a.total(o.agent_id).contains(o.resources)
                # Reserved resources go only to their role.
                assert o.resources.roles() <= {"*", o.role}
                new.append((o.framework_id, o.agent_id, o.role))
                self._take(o.framework_id, o.agent_id, o.role, o.resources)
        assert len(new) == len(set(new)), "two offers for one (framework, agent, role)"
        assert not set(new) & self.outstanding, "a second outstanding offer"
        self.outstanding |= set(new)

    @precondition(lambda self: bool(self.model))
    @rule(
        pick=st.integers(0, 10_000),
        whole=st.booleans(),
        refuse=st.sampled_from([None, 0.0, 1.0, 30.0]),
    )
    def recover(self, pick: int, whole: bool, refuse: float | None) -> None:
        keys = sorted(self.model)
        fw, agent, role = keys[pick % len(keys)]
        res = self.model[(fw, agent, role)]
        piece = res if whole else res.filter_role(sorted(res.roles())[0])
        self.a.recover_resources(fw, agent, role, piece, self.now, refuse)
        left = res - piece
        if left:
            self.model[(fw, agent, role)] = left
        else:
            del self.model[(fw, agent, role)]

    @precondition(lambda self: bool(self.outstanding))
    @rule(pick=st.integers(0, 10_000))
    def close(self, pick: int) -> None:
        keys = sorted(self.outstanding)
        fw, agent, role = keys[pick % len(keys)]
        self.a.offer_closed(fw, agent, role)
        self.outstanding.discard((fw, agent, role))

    @rule(
        j=st.integers(0, 4),
        role=st.integers(0, 2),
        count=st.integers(1, 4),
        shape=st.sampled_from(GANG_SHAPES),
        placement=st.sampled_from(list(Placement)),
        hold=st.sampled_from([1.0, 10.0, 100.0]),
        cap=st.integers(0, 2),
    )
    def request_gang(
        self,
        j: int,
        role: int,
        count: int,
        shape: str,
        placement: Placement,
        hold: float,
        cap: int,
    ) -> None:
        self.gang_ids += 1
        fw = FrameworkID(f"f{j}")
        role_name = sorted(self.roles.get(fw, ROLES))[role % len(self.roles.get(fw, ROLES))]
        request = GangRequest(
            gang_id=GangID(f"g{self.gang_ids}"),
            role=role_name,
            count=count,
            shape=R(shape),
            placement=placement,
            hold_timeout=hold,
            max_per_agent=cap,
        )
        try:
            self.a.request_gang(fw, request, self.now)
        except AllocatorError:
            assert fw not in self.known

    @rule(j=st.integers(0, 4), g=st.integers(0, 30))
    def cancel_gang(self, j: int, g: int) -> None:
        self.a.cancel_gang(FrameworkID(f"f{j}"), GangID(f"g{g}"))

    @rule()
    def expire(self) -> None:
        for e in self.a.expire(self.now):
            assert e.reason

    # ------------------------------------------------------------------ invariants

    @invariant()
    def resources_add_up(self) -> None:
        per_agent: dict[AgentID, Resources] = {}
        for (_, agent, _), res in self.model.items():
            per_agent[agent] = per_agent.get(agent, EMPTY) + res
        held = EMPTY
        for agent, total in self.totals.items():
            available = self.a.available(agent)
            assert available + per_agent.get(agent, EMPTY) == total
            assert available.contains(self.a.earmarked(agent))
            assert self.a.scalars(agent) == (
                total.scalar_totals_milli(),
                available.scalar_totals_milli(),
            )
            held = held + per_agent.get(agent, EMPTY)
        assert set(per_agent) <= set(self.totals)
        assert self.a.allocated_scalars() == held.scalar_totals_milli()

    @invariant()
    def busiest_first_by_held_percent(self) -> None:
        def percent(agent: AgentID) -> int:
            total = self.totals[agent].scalar_totals_milli()
            free = self.a.available(agent).scalar_totals_milli()
            held = [-(-(v - free.get(n, 0)) * 100 // v) for n, v in total.items() if v > 0]
            return max([0, *held])

        ranked = list(self.a.busiest())
        assert sorted(ranked) == sorted(self.totals)
        assert [self.a.busy_percent(a) for a in ranked] == [percent(a) for a in ranked]
        assert [percent(a) for a in ranked] == sorted(map(percent, ranked), reverse=True)

    @invariant()
    def allocations_match_model(self) -> None:
        for fw in self.seen:
            expected = {(k[1], k[2]): v for k, v in self.model.items() if k[0] == fw}
            assert self.a.allocated(fw) == expected

    @invariant()
    def shares_are_sane(self) -> None:
        for fw in self.known:
            assert self.a.share(fw) >= 0
            assert self.a.outstanding(fw) == {(k[1], k[2]) for k in self.outstanding if k[0] == fw}
        for role in ROLES:
            assert self.a.role_share(role) >= 0


AllocatorMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAllocatorProperties = AllocatorMachine.TestCase
