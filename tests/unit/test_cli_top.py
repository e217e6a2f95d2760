"""`agora top` without a master: the pure frame renderer, the snapshot diff, keys, and speed."""

from __future__ import annotations

import io
import time

import msgspec
from agora.sdk.cli.common import duration
from agora.sdk.cli.main import build_parser
from agora.sdk.cli.top import (
    BIG_AGENTS,
    MAX_LIMIT,
    MIN_LIMIT,
    TopState,
    handle_key,
    is_big,
    query_for,
)
from agora.sdk.cli.top_events import diff_states
from agora.sdk.cli.top_render import (
    History,
    View,
    bar,
    render,
    screen_rows,
    sparkline,
    totals,
)
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    GetState,
    MasterInfo,
    MasterMember,
    Reason,
    StateReply,
    TaskState,
    TaskSummary,
)
from agora.sdk.resources import Resources
from rich.console import Console

NOW = 1_700_000_000.0
MASTER = MasterInfo(master_id="m-1", address="tcp://127.0.0.1:5050", epoch=3)


def _agent(n: int, *, alloc: str = "", status: str = "ACTIVE") -> AgentSummary:
    return AgentSummary(
        agent_id=AgentID(f"a-{n}"),
        hostname=f"host-{n}",
        port=5051,
        status=status,
        resources=Resources.parse("cpus:4;mem:4096;disk:1000"),
        allocated=Resources.parse(alloc) if alloc else Resources(),
    )


def _task(tid: str, state: TaskState, ts: float, **kw: object) -> TaskSummary:
    return TaskSummary(
        task_id=TaskID(tid),
        framework_id=FrameworkID("f-1"),
        agent_id=AgentID("a-1"),
        state=state,
        timestamp=ts,
        **kw,  # type: ignore[arg-type]
    )


def _state() -> StateReply:
    return StateReply(
        master_info=MASTER,
        agents=(_agent(1, alloc="cpus:3;mem:1024"), _agent(2, alloc="cpus:1")),
        frameworks=(
            FrameworkSummary(framework_id=FrameworkID("f-1"), name="spark", roles=("analytics",)),
            FrameworkSummary(
                framework_id=FrameworkID("f-2"), name="batchy", roles=("*",), connected=False
            ),
        ),
        tasks=(
            _task("t-run", TaskState.RUNNING, NOW - 5),
            _task("t-stage", TaskState.STAGING, NOW - 4),
            _task("t-done", TaskState.FINISHED, NOW - 3, exit_code=0),
            _task("t-fail", TaskState.FAILED, NOW - 2, exit_code=2, message="boom"),
            _task("t-kill", TaskState.KILLED, NOW - 1),
        ),
    )


def _text(renderable: object, width: int = 160) -> str:
    console = Console(record=True, width=width, color_system=None, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_a_frame_shows_agents_frameworks_tasks_and_utilization() -> None:
    state = _state()
    history = History()
    history.add(totals(state))
    out = _text(render(state, history, [], (160, None), now=NOW))
    for word in ("host-1", "host-2", "spark", "batchy", "analytics"):
        assert word in out
    for tid, st in (
        ("t-run", "RUNNING"),
        ("t-stage", "STAGING"),
        ("t-done", "FINISHED"),
        ("t-fail", "FAILED"),
        ("t-kill", "KILLED"),
    ):
        assert tid in out and st in out
    # 4 of 8 cpus, 1024 of 8192 mem, nothing of 2000 disk, no gpus
    assert "4/8 (50%)" in out
    assert "1024/8192 (12%)" in out
    assert "0/2000 (0%)" in out
    assert "0/0 (0%)" in out
    assert "m-1" in out and "tcp://127.0.0.1:5050" in out and "epoch 3" in out
    assert "agents 2" in out and "frameworks 2" in out and "tasks 5 (2 live)" in out
    # no cluster name, no election group, no leader_since: defaults, and nothing made up
    assert "agora top  agora " in out
    assert "standby" not in out and "leading for" not in out


def _styled(renderable: object, width: int = 160) -> str:
    console = Console(
        record=True, width=width, color_system="truecolor", force_terminal=True, file=io.StringIO()
    )
    console.print(renderable)
    return console.export_text(styles=True)


def test_header_names_cluster_leader_epoch_standbys_and_how_long_it_has_led() -> None:
    state = msgspec.structs.replace(
        _state(),
        cluster="prod-eu",
        leader_since=NOW - 192,
        masters=(
            MasterMember(address="tcp://127.0.0.1:5050", role="leader"),
            MasterMember(address="tcp://10.0.0.2:5050", role="standby"),
            MasterMember(address="tcp://10.0.0.3:5050", role="standby", reachable=False),
        ),
    )
    out = _text(render(state, History(), [], (160, 40), now=NOW))
    head = out.splitlines()[:2]
    assert "prod-eu" in head[0]
    assert "leader tcp://127.0.0.1:5050 (m-1)  epoch 3  leading for 3m12s" in head[1]
    assert "standbys 2, 1 unreachable: tcp://10.0.0.3:5050" in head[1]
    assert "tcp://10.0.0.2:5050" not in out  # a reachable standby is only counted
    lonely = msgspec.structs.replace(state, masters=state.masters[:1])
    assert "no standbys" in _text(render(lonely, History(), [], (160, 40), now=NOW))


def test_duration_is_compact() -> None:
    assert [duration(s) for s in (-3, 0, 45, 192, 3599, 7500, 86_400 * 3 + 3600 * 4 + 5)] == [
        "0s",
        "0s",
        "45s",
        "3m12s",
        "59m59s",
        "2h05m",
        "3d04h",
    ]


def test_frameworks_show_share_and_outstanding_offers() -> None:
    state = _state()
    spark, batchy = state.frameworks
    state = msgspec.structs.replace(
        state,
        frameworks=(
            msgspec.structs.replace(spark, share=0.375, offers=3),
            msgspec.structs.replace(batchy, active=False),
        ),
    )
    out = _text(render(state, History(), [], (160, None), now=NOW))
    assert "SHARE" in out and "OFFERS" in out
    spark_row = next(line for line in out.splitlines() if "spark" in line)
    assert "37.5%" in spark_row and spark_row.rstrip(" │").endswith("3")
    batchy_row = next(line for line in out.splitlines() if "batchy" in line)
    assert "INACTIVE" in batchy_row and " - " in batchy_row


def test_a_master_without_curve_is_marked_insecure_in_red_in_the_header() -> None:
    secure = _text(render(_state(), History(), [], (160, 40), now=NOW))
    assert "INSECURE" not in secure
    state = msgspec.structs.replace(_state(), cluster="prod-eu", insecure=True)
    head = _text(render(state, History(), [], (160, 40), now=NOW)).splitlines()[0]
    assert head.startswith("agora top  prod-eu  INSECURE (no CURVE)  "), head
    styled = _styled(render(state, History(), [], (160, 40), now=NOW))
    assert "\x1b[1;37;41mINSECURE (no CURVE)" in styled  # bold white on red
    # On a narrow screen the counts are cut short, never the marker.
    narrow = _text(render(state, History(), [], (60, 40), now=NOW), width=60).splitlines()[0]
    assert "INSECURE (no CURVE)" in narrow


def test_a_drained_agent_shows_draining_in_its_own_style_and_can_be_filtered() -> None:
    state = _state()
    drained = msgspec.structs.replace(state.agents[0], draining=True)
    gone = msgspec.structs.replace(state.agents[1], draining=True, status="UNREACHABLE")
    state = msgspec.structs.replace(state, agents=(drained, gone))
    styled = _styled(render(state, History(), [], (160, None), now=NOW))
    assert "\x1b[1;33mDRAINING" in styled  # bold yellow
    assert "\x1b[1;31mUNREACHABLE" in styled  # unreachable wins over draining
    out = _text(render(state, History(), [], (160, None), now=NOW, view=View(filter="drain")))
    assert "host-1" in out and "host-2" not in out


def test_task_states_are_coloured() -> None:
    styled = _styled(render(_state(), History(), [], (160, None), now=NOW))
    assert "\x1b[32mFINISHED" in styled  # green
    assert "\x1b[31mFAILED" in styled  # red
    assert "\x1b[33mKILLED" in styled  # yellow
    assert "\x1b[36mRUNNING" in styled  # cyan


def test_agents_are_sorted_by_allocated_share_and_capped_by_height() -> None:
    state = msgspec.structs.replace(
        _state(), agents=tuple(_agent(n, alloc=f"cpus:{n % 5}") for n in range(1, 50))
    )
    out = _text(render(state, History(), [], (160, 30), now=NOW))
    assert "host-4 " in out  # a fully allocated one
    assert "host-5 " not in out  # an idle one
    assert "of 49" in out


def test_filter_on_the_focused_table() -> None:
    view = View(focus="tasks", filter="fail")
    out = _text(render(_state(), History(), [], (160, None), now=NOW, view=view))
    assert "t-fail" in out and "t-run" not in out
    assert "host-1" in out and "host-2" in out  # other tables unfiltered


def test_diff_reports_lost_agents_frameworks_and_task_outcomes() -> None:
    before = _state()
    after = msgspec.structs.replace(
        before,
        agents=(_agent(1, status="UNREACHABLE"),),
        frameworks=(
            msgspec.structs.replace(before.frameworks[0], connected=False),
            msgspec.structs.replace(before.frameworks[1], active=False),
        ),
        tasks=(
            _task(
                "t-run",
                TaskState.FAILED,
                NOW,
                reason=Reason.EXECUTOR_TERMINATED,
                exit_code=137,
                message="oom",
            ),
            _task("t-stage", TaskState.FINISHED, NOW, exit_code=0),
            *before.tasks[2:],
        ),
    )
    texts = [e.text for e in diff_states(before, after, NOW)]
    assert "agent host-1 became UNREACHABLE" in texts
    assert "agent host-2 removed" in texts
    assert "framework spark disconnected" in texts
    assert "framework batchy removed" in texts
    assert "task t-run FAILED: EXECUTOR_TERMINATED, exit 137, oom" in texts
    assert "task t-stage finished" in texts
    assert not any("t-done" in t or "t-fail" in t for t in texts)  # unchanged
    assert diff_states(None, after, NOW) == []
    assert diff_states(after, after, NOW) == []


def test_diff_reports_a_framework_that_failed_over_between_two_polls() -> None:
    before = _state()
    spark = before.frameworks[0]
    after = msgspec.structs.replace(
        before, frameworks=(msgspec.structs.replace(spark, failovers=1), *before.frameworks[1:])
    )
    assert [e.text for e in diff_states(before, after, NOW)] == [
        f"framework {spark.name} failed over"
    ]


def test_diff_reports_drain_reactivation_and_a_new_leader() -> None:
    before = _state()
    drained = msgspec.structs.replace(
        before,
        agents=(msgspec.structs.replace(before.agents[0], draining=True), before.agents[1]),
    )
    texts = [e.text for e in diff_states(before, drained, NOW)]
    assert texts == ["agent host-1 drained"]
    assert [e.text for e in diff_states(drained, before, NOW)] == ["agent host-1 reactivated"]
    new_leader = MasterInfo(master_id="m-2", address="tcp://10.0.0.2:5050", epoch=4)
    after = msgspec.structs.replace(before, master_info=new_leader)
    texts = [e.text for e in diff_states(before, after, NOW)]
    assert texts == ["leader changed to tcp://10.0.0.2:5050 (m-2, epoch 4)"]
    # the same master winning a later election is a leader change too
    again = msgspec.structs.replace(before, master_info=msgspec.structs.replace(MASTER, epoch=5))
    assert [e.text for e in diff_states(before, again, NOW)] == [
        "leader changed to tcp://127.0.0.1:5050 (m-1, epoch 5)"
    ]


def test_events_appear_in_the_frame() -> None:
    top = TopState()
    before = _state()
    top.update(before, NOW)
    top.update(msgspec.structs.replace(before, agents=before.agents[:1]), NOW + 1)
    out = _text(render(top.state or before, top.history, top.events, (160, None), now=NOW))
    assert "agent host-2 removed" in out
    assert len(top.history.of("cpus")) == 2


def test_history_keeps_the_last_60_samples_and_sparkline() -> None:
    history = History()
    state = _state()
    for _ in range(100):
        history.add(totals(state))
    assert len(history.of("cpus")) == 60
    assert sparkline([0.0, 0.5, 1.0]) == " ▄█"
    assert bar(0.5, 10).plain == "█████░░░░░"


def test_keys_quit_cycle_focus_and_filter() -> None:
    top = TopState()
    handle_key(top, "\t")
    assert top.view.focus == "frameworks"
    for key in "/spa":
        handle_key(top, key)
    assert (top.view.editing, top.view.filter) == (True, "spa")
    handle_key(top, "q")  # typed into the filter, not a quit
    handle_key(top, "\x7f")
    handle_key(top, "\r")
    assert (top.view.editing, top.view.filter, top.quit) == (False, "spa", False)
    handle_key(top, "\x1b")
    assert top.view.filter == ""
    handle_key(top, "q")
    assert top.quit


def test_parser_knows_top() -> None:
    args = build_parser().parse_args(["top", "--once", "--interval", "0.5"])
    assert (args.once, args.interval, args.command) == (True, 0.5, "top")


def test_a_frame_of_10000_agents_renders_fast() -> None:
    agents = tuple(_agent(n, alloc=f"cpus:{n % 4};mem:{n % 4096}") for n in range(10_000))
    tasks = tuple(
        msgspec.structs.replace(_task(f"t-{n}", TaskState.RUNNING, NOW - n), agent_id=f"a-{n}")
        for n in range(20_000)
    )
    state = msgspec.structs.replace(_state(), agents=agents, tasks=tasks)
    top = TopState()
    top.update(_state(), NOW)
    t0 = time.perf_counter()
    top.update(state, NOW + 1)  # diff + history, as each poll does
    out = _text(render(state, top.history, top.events, (200, 60), now=NOW))
    elapsed = time.perf_counter() - t0
    print(f"10,000 agents / 20,000 tasks: diff + one frame in {elapsed * 1000:.0f} ms")
    assert "of 10000" in out
    assert elapsed < 2.0


# ---------------------------------------------------------------- partial replies (big clusters)


def _partial(**kw: object) -> StateReply:
    """A window of a cluster of 1000 agents (3 unreachable, 1 draining) and 5000 tasks."""
    fields: dict[str, object] = {
        "partial": True,
        "agents_total": 1000,
        "tasks_total": 5000,
        "agents_unreachable": 3,
        "agents_draining": 1,
        "resources_total": Resources.parse("cpus:4000;mem:4096000;disk:1000000"),
        "resources_allocated": Resources.parse("cpus:1000;mem:2048000"),
        **kw,
    }
    return msgspec.structs.replace(_state(), **fields)  # type: ignore[arg-type]


def test_a_partial_reply_shows_the_whole_clusters_counts_and_sums() -> None:
    state = _partial()
    sums = totals(state)
    assert (sums.share("cpus"), sums.share("mem"), sums.share("disk")) == (0.25, 0.5, 0.0)
    history = History()
    history.add(sums)
    out = _text(render(state, history, [], (160, None), now=NOW))
    assert "1000/4000 (25%)" in out and "2048000/4096000 (50%)" in out
    assert "0/1000000 (0%)" in out
    assert "4/8 (50%)" not in out  # not the sum of the two rows shown
    assert "agents 1000 (showing 2, 3 unreachable, 1 draining)" in out
    assert "tasks 5000 (showing 5)" in out and "live)" not in out
    assert "Agents (2 of 1000)" in out and "Tasks (5 of 5000)" in out
    # per-framework and per-agent task counts come from the master, not the rows shown
    spark = next(f for f in state.frameworks if f.name == "spark")
    counted = msgspec.structs.replace(
        state,
        frameworks=tuple(
            msgspec.structs.replace(f, running=417, staging=23) if f is spark else f
            for f in state.frameworks
        ),
        agents=tuple(msgspec.structs.replace(a, tasks=311 + i) for i, a in enumerate(state.agents)),
    )
    out = _text(render(counted, history, [], (160, None), now=NOW))
    spark_row = next(line for line in out.splitlines() if "spark" in line)
    assert "417" in spark_row and "23" in spark_row
    assert "311" in out and "312" in out
    assert history.of("cpus") == (0.25,)


def test_a_partial_reply_that_holds_everything_reads_as_a_full_one() -> None:
    state = _partial(agents_total=2, tasks_total=5, agents_unreachable=0, agents_draining=0)
    out = _text(render(state, History(), [], (160, None), now=NOW))
    assert "agents 2 " in out and "tasks 5 (2 live)" in out and "showing" not in out


def test_the_agents_to_see_are_listed_before_the_busiest() -> None:
    busy = tuple(_agent(n, alloc="cpus:4") for n in range(1, 30))
    lost = _agent(99, status="UNREACHABLE")
    state = msgspec.structs.replace(_state(), agents=(*busy, lost))
    out = _text(render(state, History(), [], (160, 24), now=NOW))
    assert "host-99" in out


def test_small_clusters_are_asked_in_full_and_big_ones_for_the_rows_on_screen() -> None:
    view = View()
    assert query_for(_state(), (200, 60), view) == GetState()
    big = _partial(agents_total=BIG_AGENTS + 1)
    assert is_big(big) and is_big(_partial(agents_total=10, tasks_total=2001))
    assert not is_big(_partial(agents_total=BIG_AGENTS, tasks_total=2000))
    rows = screen_rows((200, 100))
    query = query_for(big, (200, 100), view)
    assert (query.agents_limit, query.tasks_limit) == (rows.agents, rows.tasks)
    assert rows.agents > MIN_LIMIT and rows.tasks > MIN_LIMIT  # a tall screen asks for more
    assert (query.agents_filter, query.tasks_filter) == ("", "")
    short = query_for(big, (200, 24), view)
    assert (short.agents_limit, short.tasks_limit) == (MIN_LIMIT, MIN_LIMIT)
    huge = query_for(big, (200, 2000), view)
    assert (huge.agents_limit, huge.tasks_limit) == (MAX_LIMIT, MAX_LIMIT)
    once = query_for(big, (160, None), view)  # --once: sized for the printed frame
    assert (once.agents_limit, once.tasks_limit) == (20, 20)
    # before any reply the size is unknown: ask for a window first
    assert query_for(None, (200, 24), view) == short


def test_a_big_clusters_query_filters_the_focused_table() -> None:
    big = _partial(agents_total=5000)
    tasks = query_for(big, (200, 60), View(focus="tasks", filter="FAIL"))
    assert (tasks.agents_filter, tasks.tasks_filter) == ("", "FAIL")
    agents = query_for(big, (200, 60), View(focus="agents", filter="rack-7"))
    assert (agents.agents_filter, agents.tasks_filter) == ("rack-7", "")
    frameworks = query_for(big, (200, 60), View(focus="frameworks", filter="spark"))
    assert (frameworks.agents_filter, frameworks.tasks_filter) == ("", "")
    long = query_for(big, (200, 60), View(focus="tasks", filter="x" * 1000))
    assert 0 < len(long.tasks_filter) <= 255  # GetState's filters are short strings


def test_a_10000_agent_cluster_gets_a_limited_query() -> None:
    agents = tuple(_agent(n) for n in range(10_000))
    top = TopState()
    top.update(msgspec.structs.replace(_state(), agents=agents), NOW)
    query = top.next_query((200, 60))
    assert query.agents_limit is not None and query.agents_limit <= MAX_LIMIT
    assert query.tasks_limit is not None and query.tasks_limit <= MAX_LIMIT
    small = TopState()
    small.update(_state(), NOW)
    assert small.next_query((200, 60)) == GetState()


def test_diff_of_partial_replies_invents_no_registered_or_removed_agents() -> None:
    before = _partial(agents=(_agent(1), _agent(2)))
    after = _partial(
        agents=(_agent(1), _agent(3), _agent(4, status="UNREACHABLE")),
        tasks=(*before.tasks, _task("t-new-fail", TaskState.FAILED, NOW, exit_code=1)),
    )
    texts = [e.text for e in diff_states(before, after, NOW)]
    assert texts == ["agent host-4 became UNREACHABLE", "task t-new-fail FAILED: exit 1"]
    assert diff_states(after, after, NOW) == []  # once
    # a full reply after a partial one (the cluster shrank): still no made-up news
    full = msgspec.structs.replace(_state(), agents=(_agent(1), _agent(5)))
    assert [e.text for e in diff_states(after, full, NOW)] == []
    # frameworks are always all there: their events stay
    gone = _partial(frameworks=after.frameworks[:1])
    assert "framework batchy removed" in [e.text for e in diff_states(after, gone, NOW)]


def test_rows_that_enter_a_moved_window_are_not_news() -> None:
    top = TopState()
    before = _partial(agents=(_agent(1),))
    top.update(before, NOW, GetState(agents_limit=20, tasks_limit=20))
    failed = _task("t-old-fail", TaskState.FAILED, NOW - 3600, exit_code=1)
    moved = _partial(agents=(_agent(4, status="UNREACHABLE"),), tasks=(failed,))
    top.update(moved, NOW + 1, GetState(agents_limit=20, tasks_limit=20, tasks_filter="fail"))
    assert list(top.events) == []
    # the same window next poll: a drain and a task's end are news again
    later = _partial(
        agents=(msgspec.structs.replace(_agent(4, status="UNREACHABLE"), draining=True),),
        tasks=(failed, _task("t-done", TaskState.FINISHED, NOW + 2)),
    )
    top.update(later, NOW + 2, GetState(agents_limit=20, tasks_limit=20, tasks_filter="fail"))
    assert [e.text for e in top.events] == ["agent host-4 drained", "task t-done finished"]
