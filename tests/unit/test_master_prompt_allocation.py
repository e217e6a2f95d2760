"""A new framework's first offer leaves with its subscription, not at the next batch tick."""

from __future__ import annotations

from typing import Any

import pytest
from agora.master.core import MasterConfig
from agora.master.core import offers as offers_module
from agora.master.core.prompt import PROMPT_GAP_FRACTION
from agora.sdk.messages import FrameworkInfo, Revive, Subscribe, Subscribed
from support.master_kit import Harness, of_type, offers_in, only, sent_to

AGENT = "cpus:4;mem:4096"


def _idle_cluster(config: MasterConfig | None = None) -> Harness:
    # allocation_interval 1.0: a tick-driven offer would wait for h.tick()
    h = Harness(config or MasterConfig())
    h.register_agent("a1", AGENT)
    h.now += h.config.allocation_interval  # well past any earlier prompt pass
    return h


def test_subscribe_on_an_idle_agent_is_offered_in_the_same_handle() -> None:
    h = _idle_cluster()
    mark = len(h.sent)
    fw = h.subscribe("s1")
    out = h.sent[mark:]  # everything the SUBSCRIBE caused (incl. the registry commit); no tick
    assert only(of_type(sent_to(out, "s1"), Subscribed)).framework_id == fw
    offer = only(offers_in(out, "s1"))
    assert offer.framework_id == fw and str(offer.resources) == str(h.unclaimed(offer.agent_id))


def test_resubscription_after_failover_is_offered_at_once() -> None:
    h = _idle_cluster()
    fw = h.subscribe("s1", failover_timeout=60.0)
    h.disconnect("s1")  # its offers are rescinded; the agent is idle again
    h.now += h.config.allocation_interval
    mark = len(h.sent)
    assert h.subscribe("s1b", framework_id=fw, failover_timeout=60.0) == fw
    assert len(offers_in(h.sent[mark:], "s1b")) == 1


def test_revive_is_offered_at_once() -> None:
    h = _idle_cluster()
    fw = h.subscribe("s1", suppressed_roles=("*",))
    assert offers_in(h.tick(h.config.allocation_interval), "s1") == []
    h.now += h.config.allocation_interval
    assert len(offers_in(h.handle("s1", Revive(framework_id=fw)), "s1")) == 1


def test_a_deferred_burst_allocates_once_when_the_daemon_asks() -> None:
    h = _idle_cluster(MasterConfig(bursts=True))
    # The daemon's core is fed in bursts: handle leaves allocation to end_burst.
    for peer in ("s1", "s2"):
        info = FrameworkInfo(name=peer, roles=("*",))
        out = h.master.handle(peer, Subscribe(framework_info=info), h.now)
        assert offers_in(out, peer) == []
        assert len(of_type(sent_to(out, peer), Subscribed)) == 1
    freed = h.master.end_burst(h.now)
    assert len(offers_in(freed, "s1") + offers_in(freed, "s2")) == 1  # one agent, one pass


def test_a_subscription_storm_makes_a_bounded_number_of_full_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = _idle_cluster()
    passes: list[Any] = []
    real = offers_module.allocate

    def counting(st: Any, now: float, agents: Any) -> None:
        if agents is None:
            passes.append(now)
        real(st, now, agents)

    monkeypatch.setattr(offers_module, "allocate", counting)
    for i in range(50):  # fifty schedulers subscribe at the same instant
        h.subscribe(f"s{i}")
    assert len(passes) == 1  # the first is served at once; the rest wait for the tick
    gap = h.config.allocation_interval * PROMPT_GAP_FRACTION
    h.tick(gap)
    assert len(passes) == 2  # the owed pass is made once, by the tick
