"""The Raft core's rules, one test each, driven by hand with explicit times."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from agora.master.election.raft import RaftNode
from agora.master.election.types import HardState, RaftConfig, Ready, Role, Snapshot
from agora.sdk.messages import (
    AppendEntries,
    AppendReply,
    InstallSnapshot,
    LogEntry,
    Message,
    Ping,
    SnapshotReply,
    VoteReply,
    VoteRequest,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from support.raft_sim import RaftSim

M = TypeVar("M", bound=Message)
ABC = ("a", "b", "c")
T = 1.0


def node(
    me: str = "a",
    members: tuple[str, ...] = ABC,
    *,
    term: int = 0,
    voted: str | None = None,
    terms: Sequence[int] = (),
    snapshot: Snapshot | None = None,
    now: float = 0.0,
    **config: object,
) -> RaftNode:
    """A node whose log holds entries of ``terms`` after ``snapshot``."""
    base = snapshot.index if snapshot else 0
    entries = [
        LogEntry(term=t, index=base + i + 1, data=b"%d" % (base + i + 1))
        for i, t in enumerate(terms)
    ]
    cfg = RaftConfig(node_id=me, members=members, **config)  # type: ignore[arg-type]
    return RaftNode(
        cfg,
        hard_state=HardState(term=term, voted_for=voted),
        snapshot=snapshot,
        entries=entries,
        now=now,
        rng=random.Random(1),
    )


def sent(ready: Ready, kind: type[M], to: str | None = None) -> list[M]:
    return [m for dst, m in ready.messages if isinstance(m, kind) and (to is None or dst == to)]


def vote(
    sender: str, term: int, last_index: int = 0, last_term: int = 0, pre: bool = False
) -> VoteRequest:
    return VoteRequest(
        sender=sender, term=term, last_log_index=last_index, last_log_term=last_term, pre_vote=pre
    )


def role(n: RaftNode) -> Role:
    """``n.role`` read afresh (mypy would keep an earlier assertion's narrowing)."""
    return n.role


def elect(n: RaftNode, now: float = 2.0) -> Ready:
    """Time ``n`` out and win its pre-vote and vote with b's help; the winning Ready."""
    n.tick(now)
    assert n.role is Role.PRE_CANDIDATE
    n.step(VoteReply(sender="b", term=n.term + 1, granted=True, pre_vote=True), now)
    assert role(n) is Role.CANDIDATE
    ready = n.step(VoteReply(sender="b", term=n.term, granted=True), now)
    assert role(n) is Role.LEADER
    return ready


def ack(n: RaftNode, sender: str, match: int, now: float, seq: int = 1) -> Ready:
    reply = AppendReply(sender=sender, term=n.term, success=True, match_index=match, seq=seq)
    return n.step(reply, now)


# -- elections -------------------------------------------------------------------------------


def test_votes_once_per_term_and_persists_the_vote_before_replying() -> None:
    n = node(term=1)
    ready = n.step(vote("b", 2), 1.5)
    assert sent(ready, VoteReply, "b")[0].granted
    assert ready.hard_state == HardState(term=2, voted_for="b")
    assert not sent(n.step(vote("c", 2), 1.6), VoteReply)[0].granted
    again = n.step(vote("b", 2), 1.7)  # a duplicate request gets the same answer
    assert sent(again, VoteReply)[0].granted and again.hard_state is None


def test_votes_only_for_a_log_at_least_as_up_to_date() -> None:
    n = node(term=2, terms=[1, 2])
    assert not sent(n.step(vote("b", 3, last_index=5, last_term=1), 1.5), VoteReply)[0].granted
    assert not sent(n.step(vote("b", 3, last_index=1, last_term=2), 1.5), VoteReply)[0].granted
    assert sent(n.step(vote("b", 3, last_index=2, last_term=2), 1.5), VoteReply)[0].granted


def test_pre_vote_changes_neither_term_nor_vote() -> None:
    n = node(term=3, voted="c")
    ready = n.step(vote("b", 5, pre=True), 1.5)
    reply = sent(ready, VoteReply)[0]
    assert reply.granted and reply.pre_vote and reply.term == 5
    assert n.term == 3 and ready.hard_state is None


def test_timed_out_follower_asks_for_pre_votes_at_the_next_term_without_taking_it() -> None:
    n = node(term=4)
    ready = n.tick(2.0)
    assert n.role is Role.PRE_CANDIDATE and n.term == 4 and ready.hard_state is None
    requests = sent(ready, VoteRequest)
    assert {r.term for r in requests} == {5} and all(r.pre_vote for r in requests)
    assert len(requests) == 2


def test_rejected_pre_vote_steps_down_only_to_a_really_higher_term() -> None:
    n = node(term=4)
    n.tick(2.0)
    n.step(VoteReply(sender="b", term=4, granted=False, pre_vote=True), 2.0)
    assert n.term == 4
    ready = n.step(VoteReply(sender="c", term=7, granted=False, pre_vote=True), 2.0)
    assert n.term == 7 and n.role is Role.FOLLOWER and ready.hard_state == HardState(term=7)


def test_partitioned_node_rejoining_does_not_disrupt_the_leader() -> None:
    sim = RaftSim(3, 3)
    assert sim.run_until(lambda: sim.leader() is not None, 5.0)
    leader = sim.leader()
    assert leader is not None
    outcast = next(n for n in sim.names if n != leader)
    before = sim.members[leader].raft
    assert before is not None
    term = before.term
    sim.isolate(outcast)
    sim.run_for(10.0)
    sim.heal()
    sim.run_for(3.0)
    assert sim.leader() == leader
    for m in sim.members.values():
        assert m.raft is not None and m.raft.term == term


def test_without_pre_vote_a_rejoining_node_does_disrupt() -> None:
    """The contrast that shows the test above can fail."""
    sim = RaftSim(3, 3, pre_vote=False)
    assert sim.run_until(lambda: sim.leader() is not None, 5.0)
    leader = sim.leader()
    outcast = next(n for n in sim.names if n != leader)
    raft = sim.members[outcast].raft
    assert raft is not None
    term = raft.term
    sim.isolate(outcast)
    sim.run_for(10.0)
    assert raft.term > term + 3


def test_leader_stickiness_refuses_votes_within_t_of_hearing_the_leader() -> None:
    n = node(term=1)
    n.step(AppendEntries(sender="b", term=1, prev_log_index=0, prev_log_term=0), 5.0)
    ready = n.step(vote("c", 2), 5.5)
    assert not sent(ready, VoteReply)[0].granted and n.term == 1 and n.leader_id == "b"
    assert not sent(n.step(vote("c", 2, pre=True), 5.9), VoteReply)[0].granted
    assert sent(n.step(vote("c", 2), 6.01), VoteReply)[0].granted


def test_a_restarted_node_refuses_votes_for_t() -> None:
    n = node(term=1, now=100.0)
    assert not sent(n.step(vote("c", 2), 100.5), VoteReply)[0].granted
    assert sent(n.step(vote("c", 2), 101.0), VoteReply)[0].granted


def test_election_timeout_is_randomized_in_t_to_2t() -> None:
    dues = []
    for seed in range(30):
        cfg = RaftConfig(node_id="a", members=ABC)
        n = RaftNode(
            cfg, hard_state=HardState(), snapshot=None, entries=[], now=0.0, rng=random.Random(seed)
        )
        now = 0.0
        while n.role is Role.FOLLOWER:
            now += 0.01
            n.tick(now)
        dues.append(now)
    assert min(dues) >= T and max(dues) <= 2 * T + 0.01
    assert max(dues) - min(dues) > 0.3  # really random, not one fixed timeout


def test_single_member_group_elects_itself_and_commits_on_append() -> None:
    n = node("a", ("a",))
    first = n.tick(0.01)
    assert n.role is Role.LEADER and n.term == 1 and first.hard_state == HardState(1, "a")
    assert [e.data for e in first.committed] == [b""]
    index, ready = n.propose(b"x", 0.02)
    assert index == 2 and [e.data for e in ready.committed] == [b"x"]
    assert n.lease_valid(0.03)


# -- replication -----------------------------------------------------------------------------


def test_new_leader_appends_a_noop_and_commits_it_with_a_majority() -> None:
    n = node(term=1, terms=[1])
    ready = elect(n)
    assert ready.append == [LogEntry(term=2, index=2, data=b"")]
    assert all(m.entries == (ready.append[0],) for m in sent(ready, AppendEntries))
    assert n.commit_index == 0
    done = ack(n, "c", 2, 2.01)
    assert [e.index for e in done.committed] == [1, 2] and n.commit_index == 2


def test_entries_of_earlier_terms_commit_only_with_one_of_the_current_term() -> None:
    """Raft Figure 8: a majority holding an old-term entry does not commit it."""
    n = node(term=3, terms=[1, 2])  # index 2 (term 2) may be overwritten by a term-3 leader
    elect(n)  # term 4, no-op at index 3
    assert not ack(n, "b", 2, 2.01).committed and n.commit_index == 0
    done = ack(n, "b", 3, 2.02)
    assert [e.index for e in done.committed] == [1, 2, 3]


def test_follower_truncates_a_conflicting_suffix() -> None:
    n = node(term=2, terms=[1, 1, 2, 2])
    new = LogEntry(term=3, index=3, data=b"new")
    ready = n.step(
        AppendEntries(
            sender="b",
            term=3,
            prev_log_index=2,
            prev_log_term=1,
            entries=(new,),
            leader_commit=3,
            seq=4,
        ),
        1.0,
    )
    assert ready.truncate_after == 2 and ready.append == [new]
    reply = sent(ready, AppendReply)[0]
    assert reply.success and reply.match_index == 3 and reply.seq == 4
    assert n.last_index == 3 and [e.index for e in ready.committed] == [1, 2, 3]


def test_follower_failure_hint_lets_the_leader_back_off_fast() -> None:
    short = node(term=1, terms=[1, 1])
    far = AppendEntries(sender="b", term=1, prev_log_index=10, prev_log_term=1)
    reply = sent(short.step(far, 1.0), AppendReply)[0]
    assert not reply.success and reply.match_index == 2
    # A conflicting suffix of a later term is skipped whole.
    diverged = node(term=3, terms=[1, 1, 3, 3, 3])
    probe = AppendEntries(sender="b", term=3, prev_log_index=5, prev_log_term=2)
    assert sent(diverged.step(probe, 1.0), AppendReply)[0].match_index == 2
    # The leader resends from the hint at once.
    leader = node(term=1, terms=[1] * 10)
    elect(leader)
    nack = AppendReply(sender="b", term=2, success=False, match_index=2, seq=1)
    again = sent(leader.step(nack, 2.01), AppendEntries, "b")
    assert again[0].prev_log_index == 2 and again[0].entries[0].index == 3


def test_appends_respect_entry_and_byte_limits_but_carry_at_least_one() -> None:
    n = node(term=1, terms=[1] * 9, max_entries_per_append=4, max_bytes_per_append=3)
    elect(n)
    nack = AppendReply(sender="b", term=2, success=False, match_index=0, seq=1)
    batch = sent(n.step(nack, 2.01), AppendEntries, "b")[0]
    assert [e.index for e in batch.entries] == [1, 2, 3]  # 3 bytes of data: b"1" b"2" b"3"
    big = node(term=1, max_bytes_per_append=1)
    elect(big)
    _, ready = big.propose(b"far more than one byte", 2.01)
    assert all(len(m.entries) == 1 for m in sent(ready, AppendEntries))


def test_leader_heartbeats_every_follower_when_idle() -> None:
    n = node()
    elect(n, now=2.0)
    assert not n.tick(2.05).messages
    beat = n.tick(2.1)
    assert sorted(to for to, m in beat.messages if isinstance(m, AppendEntries)) == ["b", "c"]
    # The no-op went out optimistically, so the heartbeat carries nothing new.
    assert [(m.prev_log_index, m.entries) for m in sent(beat, AppendEntries)] == [(1, ())] * 2


def test_lagging_follower_gets_the_snapshot_and_resumes_after_it() -> None:
    leader = node(term=1, terms=[1, 1, 1, 1])
    elect(leader)  # term 2, no-op at 5
    ack(leader, "b", 5, 2.01)
    assert leader.commit_index == 5
    snap = Snapshot(index=4, term=1, data=b"state@4")
    assert leader.compact(snap).snapshot == snap
    nack = AppendReply(sender="c", term=2, success=False, match_index=0, seq=1)
    install = sent(leader.step(nack, 2.02), InstallSnapshot, "c")[0]
    assert (install.last_index, install.last_term, install.data) == (4, 1, b"state@4")

    follower = node("c", term=1, terms=[1])
    ready = follower.step(install, 2.03)
    assert ready.snapshot == snap and follower.commit_index == 4 and not ready.committed
    assert sent(ready, SnapshotReply)[0].match_index == 4
    done = leader.step(SnapshotReply(sender="c", term=2, match_index=4, seq=1), 2.04)
    rest = sent(done, AppendEntries, "c")[0]
    assert rest.prev_log_index == 4 and [e.index for e in rest.entries] == [5]
    applied = follower.step(rest, 2.05)
    assert [e.index for e in applied.committed] == [5]


def test_lease_starts_at_the_first_majority_acked_round_and_lasts_t_minus_drift() -> None:
    n = node()
    elect(n, now=2.0)  # round 1 sent at 2.0
    assert not n.lease_valid(2.0)
    n.tick(2.1)  # round 2 sent at 2.1
    ack(n, "b", 1, 2.15, seq=2)
    end = 2.1 + T * (1 - 0.05) - 0.05
    assert n.lease_valid(2.15) and n.lease_valid(end - 0.001) and not n.lease_valid(end)
    ack(n, "c", 1, 2.2, seq=1)  # an older round does not move the lease back or forward
    assert not n.lease_valid(end)


def test_check_quorum_steps_a_lonely_leader_down() -> None:
    n = node()
    elect(n, now=2.0)
    term = n.term
    now = 2.0
    while now < 2.0 + T - 0.02:
        now += 0.01
        n.tick(now)
    assert n.role is Role.LEADER and n.contact(now) == {"b": None, "c": None}
    ack(n, "b", 0, now)
    assert n.contact(now + 0.5) == {"b": 0.5, "c": None}
    n.tick(now + T + 0.01)
    assert role(n) is Role.FOLLOWER and n.term == term and n.leader_id is None
    assert n.contact(now + T + 0.02) == {}


def test_hard_state_rides_in_the_same_ready_as_the_messages_that_need_it() -> None:
    n = node(term=1, pre_vote=False)
    ready = n.tick(2.0)
    assert ready.hard_state == HardState(term=2, voted_for="a")
    assert {m.term for m in sent(ready, VoteRequest)} == {2}


def test_committed_entries_are_emitted_once_and_again_after_a_restart() -> None:
    n = node(term=1, terms=[1, 1])
    elect(n)
    first = ack(n, "b", 3, 2.01)
    assert [e.index for e in first.committed] == [1, 2, 3]
    assert not ack(n, "b", 3, 2.02).committed and not ack(n, "c", 3, 2.03).committed
    restarted = node(term=2, terms=[1, 1, 2], snapshot=None)
    beat = AppendEntries(sender="b", term=2, prev_log_index=3, prev_log_term=2, leader_commit=3)
    assert [e.index for e in restarted.step(beat, 0.5).committed] == [1, 2, 3]
    assert not restarted.step(beat, 0.6).committed


def test_ignores_strangers_itself_and_other_messages() -> None:
    n = node(term=1)
    for msg in (vote("z", 9), vote("a", 9), Ping()):
        assert n.step(msg, 5.0).empty()
    assert n.term == 1


_ints = st.integers(0, 12)
_entry = st.builds(LogEntry, term=_ints, index=_ints, data=st.binary(max_size=3))
_peer_messages = st.one_of(
    st.builds(
        VoteRequest,
        sender=st.sampled_from(ABC),
        term=_ints,
        last_log_index=_ints,
        last_log_term=_ints,
        pre_vote=st.booleans(),
    ),
    st.builds(
        VoteReply,
        sender=st.sampled_from(ABC),
        term=_ints,
        granted=st.booleans(),
        pre_vote=st.booleans(),
    ),
    st.builds(
        AppendEntries,
        sender=st.sampled_from(ABC),
        term=_ints,
        prev_log_index=_ints,
        prev_log_term=_ints,
        entries=st.lists(_entry, max_size=3).map(tuple),
        leader_commit=_ints,
        seq=_ints,
    ),
    st.builds(
        AppendReply,
        sender=st.sampled_from(ABC),
        term=_ints,
        success=st.booleans(),
        match_index=_ints,
        seq=_ints,
    ),
    st.builds(
        InstallSnapshot,
        sender=st.sampled_from(ABC),
        term=_ints,
        last_index=_ints,
        last_term=_ints,
        data=st.binary(max_size=3),
        seq=_ints,
    ),
    st.builds(SnapshotReply, sender=st.sampled_from(ABC), term=_ints, match_index=_ints, seq=_ints),
    st.builds(Ping),
)


@settings(max_examples=150, deadline=None)
@given(msgs=st.lists(_peer_messages, max_size=30), lead=st.booleans())
def test_never_raises_on_hostile_or_stale_messages(msgs: list[Message], lead: bool) -> None:
    n = node(term=1, terms=[1, 1, 1])
    if lead:
        elect(n)
    now = 2.0
    for msg in msgs:
        now += 0.03
        n.step(msg, now)
        n.tick(now)
        assert n.commit_index <= n.last_index
    n.propose(b"p", now)


def test_a_burst_of_proposals_goes_out_in_a_few_appends_not_one_per_entry() -> None:
    """Thousands of registrations at once must not overflow the small peer queues: one batch
    of proposals sends each follower at most a handful of AppendEntries."""
    leader = node(term=1)
    elect(leader)
    for peer in ("b", "c"):
        ack(leader, peer, leader.last_index, 2.01)
    indexes, ready = leader.propose_many([b"x%d" % i for i in range(2000)], 2.02)
    assert indexes == list(range(indexes[0], indexes[0] + 2000))  # type: ignore[index]
    for peer in ("b", "c"):
        appends = sent(ready, AppendEntries, peer)
        assert 1 <= len(appends) <= 4
        carried = [e.index for m in appends for e in m.entries]
        assert carried == sorted(carried) and carried[0] == indexes[0]  # type: ignore[index]
    assert node(me="b", term=1).propose_many([b"x"], 1.0)[0] is None, "a follower appends none"


def test_stale_refusals_after_a_gap_cause_one_resend_per_round() -> None:
    leader = node(term=1, terms=[1] * 20)
    elect(leader)
    nack = AppendReply(sender="b", term=2, success=False, match_index=5, seq=1)
    first = sent(leader.step(nack, 2.01), AppendEntries, "b")
    assert first and first[0].prev_log_index == 5
    # The same refusal again, from the same round (messages that were in flight): no resend.
    assert sent(leader.step(nack, 2.02), AppendEntries, "b") == []
    # A refusal from a newer round (the resend was lost, the next heartbeat is refused) resends.
    heartbeat = sent(leader.tick(2.15), AppendEntries, "b")
    assert heartbeat
    newer = AppendReply(sender="b", term=2, success=False, match_index=5, seq=heartbeat[-1].seq)
    again = sent(leader.step(newer, 2.16), AppendEntries, "b")
    assert again and again[0].prev_log_index == 5
