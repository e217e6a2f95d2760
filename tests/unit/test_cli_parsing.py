"""The `agora` CLI without processes: argument parsing, JSON and tables, exit-code mapping, and the
one-task scheduler of `agora run` driven by a recording fake driver."""

from __future__ import annotations

import asyncio
import io
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from agora.sdk.cli import main as cli_main
from agora.sdk.cli.common import CliError, resolve_master
from agora.sdk.cli.local import remove_address, write_address
from agora.sdk.cli.main import build_parser
from agora.sdk.cli.run import RunOptions, RunScheduler, exit_code_for
from agora.sdk.cli.show import (
    agents_json,
    agents_table,
    frameworks_table,
    live_tasks,
    state_json,
    tasks_json,
    tasks_table,
)
from agora.sdk.executor import OUTPUT_LABEL, encode_output
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, OfferID, TaskID
from agora.sdk.messages import (
    AgentSummary,
    FrameworkSummary,
    MasterInfo,
    Offer,
    Reason,
    StateReply,
    StatusSource,
    TaskState,
    TaskStatus,
    TaskSummary,
)
from agora.sdk.resources import Resources
from rich.console import Console

# ------------------------------------------------------------------ parsing


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


def test_local_defaults_and_options() -> None:
    args = parse("local")
    assert (args.agents, args.work_dir, args.agent_resources, args.log_level) == (
        2,
        None,
        None,
        "info",
    )
    args = parse(
        "local", "--agents", "3", "--work-dir", "/tmp/x", "--agent-resources", "cpus:2;mem:512"
    )
    assert (args.agents, args.work_dir, args.agent_resources) == (
        3,
        Path("/tmp/x"),
        ["cpus:2;mem:512"],
    )
    args = parse(
        "local",
        *("--agent-resources", "cpus:4;mem:4096", "--agent-resources", "cpus:1;mem:512"),
        *("--agent-attributes", "rack:a", "--agent-attributes", "rack:b;gpu:yes"),
    )
    assert args.agent_resources == ["cpus:4;mem:4096", "cpus:1;mem:512"]
    assert args.agent_attributes == ["rack:a", "rack:b;gpu:yes"]
    assert parse("local", "--log-level", "debug").log_level == "debug"


@pytest.mark.parametrize(
    "argv",
    [
        ("local", "--agents", "0"),
        ("local", "--agents", "two"),
        ("local", "--log-level", "loud"),
        ("run", "--cpus", "-1", "--", "true"),
        ("run", "--mem", "nan", "--", "true"),
        ("state", "--timeout", "0"),
        ("kill",),
        ("frobnicate",),
        (),
    ],
)
def test_bad_arguments_exit_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "usage: agora" in capsys.readouterr().err


def test_run_takes_everything_after_the_double_dash() -> None:
    args = parse("run", "--cpus", "0.5", "--mem", "64", "--name", "x", "--", "sh", "-c", "exit 3")
    assert (args.cpus, args.mem, args.name) == (0.5, 64.0, "x")
    assert args.command == "run"
    assert args.argv == ["--", "sh", "-c", "exit 3"]
    assert parse("run", "echo", "--mem", "4").argv == ["echo", "--mem", "4"]
    defaults = parse("run", "--", "true")
    assert (defaults.cpus, defaults.mem, defaults.master, defaults.timeout) == (
        0.1,
        32.0,
        None,
        30.0,
    )


def test_run_without_a_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["run", "--"]) == 2
    assert "no command given" in capsys.readouterr().err


def test_show_and_kill_arguments() -> None:
    assert parse("state", "--json").json is True
    tasks = parse("tasks", "--all", "--master", "tcp://h:1", "--timeout", "2.5")
    assert (tasks.all, tasks.json, tasks.master, tasks.timeout) == (True, False, "tcp://h:1", 2.5)
    assert parse("agents").timeout == 5.0
    kill = parse("kill", "t-1", "--framework", "fw-9")
    assert (kill.task_id, kill.framework) == ("t-1", "fw-9")


def test_master_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGORA_HOME", str(tmp_path))
    monkeypatch.delenv("AGORA_MASTER", raising=False)
    assert resolve_master(parse("state")) == "tcp://127.0.0.1:5050"
    path = write_address("tcp://127.0.0.1:4242")
    assert path == tmp_path / "master"
    assert resolve_master(parse("state")) == "tcp://127.0.0.1:4242"
    monkeypatch.setenv("AGORA_MASTER", "tcp://10.0.0.1:5050")
    assert resolve_master(parse("state")) == "tcp://10.0.0.1:5050"
    assert resolve_master(parse("state", "--master", "h:7")) == "tcp://h:7"


def test_address_file_is_removed_only_when_still_ours(tmp_path: Path) -> None:
    env = {"AGORA_HOME": str(tmp_path / "home")}
    path = write_address("tcp://127.0.0.1:1", env)
    remove_address(path, "tcp://127.0.0.1:2")  # another agora local wrote it since
    assert path.read_text().strip() == "tcp://127.0.0.1:1"
    remove_address(path, "tcp://127.0.0.1:1")
    assert not path.exists()
    remove_address(path, "tcp://127.0.0.1:1")  # already gone: no error


# ------------------------------------------------------------------ JSON and tables


def _reply() -> StateReply:
    fw = FrameworkID("fw-1")
    return StateReply(
        master_info=MasterInfo(master_id="m-1", address="tcp://127.0.0.1:5050", epoch=3),
        agents=(
            AgentSummary(
                agent_id=AgentID("a-1"),
                hostname="agent-1",
                port=31000,
                status="ACTIVE",
                resources=Resources.parse("cpus:4;mem:4096;ports:[31000-32000]"),
                allocated=Resources.parse("cpus:0.1;mem:32"),
                attributes={"rack": "r1"},
            ),
        ),
        frameworks=(FrameworkSummary(framework_id=fw, name="agora-run", roles=("*",), user="me"),),
        tasks=(
            TaskSummary(
                task_id=TaskID("sleeper"),
                framework_id=fw,
                agent_id=AgentID("a-1"),
                name="sleeper",
                state=TaskState.RUNNING,
                resources=Resources.parse("cpus:0.1;mem:32"),
                timestamp=1_700_000_000.0,
            ),
            TaskSummary(
                task_id=TaskID("done"),
                framework_id=fw,
                agent_id=AgentID("a-1"),
                state=TaskState.FAILED,
                reason=Reason.EXECUTOR_TERMINATED,
                message="Command exited with status 3",
                exit_code=3,
            ),
        ),
    )


def test_state_json_has_records_as_objects_enums_as_names_resources_as_dicts() -> None:
    doc = json.loads(json.dumps(state_json(_reply())))
    assert doc["master_info"] == {
        "master_id": "m-1",
        "address": "tcp://127.0.0.1:5050",
        "epoch": 3,
        "features": [],
    }
    (agent,) = doc["agents"]
    assert agent["hostname"] == "agent-1"
    assert agent["resources"] == {"cpus": 4, "mem": 4096, "ports": [[31000, 32000]]}
    assert agent["allocated"] == {"cpus": 0.1, "mem": 32}
    assert agent["attributes"] == {"rack": "r1"}
    assert doc["frameworks"][0]["roles"] == ["*"]
    assert doc["frameworks"][0]["principal"] is None
    running, failed = doc["tasks"]
    assert (running["state"], running["reason"], running["exit_code"]) == ("RUNNING", None, None)
    assert (failed["state"], failed["reason"], failed["exit_code"]) == (
        "FAILED",
        "EXECUTOR_TERMINATED",
        3,
    )
    assert Resources.from_dict(running["resources"]) == Resources.parse("cpus:0.1;mem:32")


def test_agents_and_tasks_json() -> None:
    reply = _reply()
    assert [a["agent_id"] for a in agents_json(reply)] == ["a-1"]
    assert [t["task_id"] for t in tasks_json(reply, include_done=False)] == ["sleeper"]
    assert [t["task_id"] for t in tasks_json(reply, include_done=True)] == ["sleeper", "done"]
    assert [t.task_id for t in live_tasks(reply.tasks)] == ["sleeper"]


def test_tables_show_the_rows() -> None:
    reply = _reply()
    console = Console(record=True, width=250)
    console.print(agents_table(reply.agents))
    console.print(frameworks_table(reply.frameworks))
    console.print(tasks_table(reply.tasks))
    text = console.export_text()
    for needle in ("agent-1", "ACTIVE", "cpus:4;mem:4096", "agora-run", "sleeper", "FAILED"):
        assert needle in text
    assert "EXECUTOR_TERMINATED" in text


# ------------------------------------------------------------------ exit codes


def _status(state: TaskState, exit_code: int | None = None, **kw: Any) -> TaskStatus:
    return TaskStatus(
        task_id=TaskID("t"), state=state, source=StatusSource.EXECUTOR, exit_code=exit_code, **kw
    )


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [
        (TaskState.FINISHED, 0, 0),
        (TaskState.FINISHED, None, 0),
        (TaskState.FAILED, 3, 3),
        (TaskState.FAILED, 255, 255),
        (TaskState.FAILED, -9, 128 + 9),
        (TaskState.KILLED, None, 128 + signal.SIGTERM),
        (TaskState.KILLED, 0, 128 + signal.SIGTERM),
        (TaskState.KILLED, -15, 128 + 15),
        (TaskState.KILLED, -9, 128 + 9),
        (TaskState.KILLED, 2, 2),
    ],
)
def test_exit_code_of_a_task(state: TaskState, exit_code: int | None, expected: int) -> None:
    assert exit_code_for(_status(state, exit_code)) == (expected, None)


@pytest.mark.parametrize(
    "state",
    [TaskState.LOST, TaskState.ERROR, TaskState.DROPPED, TaskState.GONE, TaskState.UNREACHABLE],
)
def test_other_ends_exit_1_with_the_state_and_reason(state: TaskState) -> None:
    code, message = exit_code_for(_status(state, reason=Reason.AGENT_REMOVED, message="gone away"))
    assert code == 1
    assert message is not None
    assert state.name in message and "AGENT_REMOVED" in message and "gone away" in message


def test_failed_without_a_status_exits_1_and_says_why() -> None:
    code, message = exit_code_for(
        _status(TaskState.FAILED, reason=Reason.EXECUTOR_TERMINATED, message="Executor exited")
    )
    assert code == 1
    assert message is not None and "EXECUTOR_TERMINATED" in message


@pytest.mark.parametrize(
    ("state", "exit_code", "expected"),
    [(TaskState.FAILED, -9, 128 + 9), (TaskState.KILLED, -15, 128 + 15)],
)
def test_an_end_with_a_reason_keeps_the_exit_status_and_says_why(
    state: TaskState, exit_code: int, expected: int
) -> None:
    status = _status(
        state,
        exit_code,
        reason=Reason.CONTAINER_LIMITATION_MEMORY,
        message="Memory limit exceeded: 64 MiB",
    )
    assert exit_code_for(status) == (
        expected,
        f"task t ended {state.name}, reason CONTAINER_LIMITATION_MEMORY: "
        "Memory limit exceeded: 64 MiB",
    )


def test_verbose_run_notes_each_state_with_its_reason_and_message() -> None:
    async def scenario() -> None:
        err = io.BytesIO()
        opts = RunOptions(master="tcp://x:1", argv=("true",), verbose=True)
        sched = RunScheduler(opts, TaskID("t"), io.BytesIO(), err)
        failed = _status(
            TaskState.FAILED, 3, reason=Reason.COMMAND_EXECUTOR_FAILED, message="exited 3"
        )
        sched.status_update(FakeDriver(), failed)
        assert err.getvalue() == (
            b"agora run: task t is FAILED, reason COMMAND_EXECUTOR_FAILED: exited 3\n"
        )

    asyncio.run(asyncio.wait_for(scenario(), 10))


# ------------------------------------------------------------------ the one-task scheduler


class FakeDriver:
    """Records the calls `agora run`'s scheduler makes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def launch(self, offer: Offer, tasks: list[Any]) -> None:
        self.calls.append(("launch", (offer.offer_id, tasks)))

    def decline(self, offer_ids: list[OfferID], filters: Any = None) -> None:
        self.calls.append(("decline", tuple(offer_ids)))

    def suppress(self) -> None:
        self.calls.append(("suppress", None))

    def revive(self) -> None:
        self.calls.append(("revive", None))


def _offer(oid: str, resources: str) -> Offer:
    return Offer(
        offer_id=OfferID(oid),
        framework_id=FrameworkID("fw"),
        agent_id=AgentID("a-" + oid),
        hostname="agent-" + oid,
        role="*",
        resources=Resources.parse(resources),
    )


def test_run_scheduler_launches_once_relays_output_and_ends_on_a_terminal_update() -> None:
    async def scenario() -> None:
        out, err = io.BytesIO(), io.BytesIO()
        opts = RunOptions(master="tcp://x:1", argv=("echo", "hello world"), cpus=1, mem=64)
        sched = RunScheduler(opts, TaskID("t"), out, err)
        driver = FakeDriver()
        sched.offers(
            driver, [_offer("small", "cpus:0.5;mem:1024"), _offer("big", "cpus:2;mem:128")]
        )
        assert driver.calls[0] == ("decline", (OfferID("small"),))
        kind, (offer_id, (spec,)) = driver.calls[1]
        assert (kind, offer_id) == ("launch", OfferID("big"))
        assert spec.command == "echo 'hello world'"  # shlex.join, run by the shell
        assert spec.labels == {OUTPUT_LABEL: "1"}
        assert spec.id == TaskID("t")
        assert driver.calls[2] == ("suppress", None)
        assert sched.launched.is_set()
        sched.offers(driver, [_offer("late", "cpus:8;mem:8192")])
        assert driver.calls[3] == ("decline", (OfferID("late"),))

        aid, eid = AgentID("a-big"), ExecutorID("agora-command")
        sched.framework_message(driver, aid, eid, encode_output("t", "stdout", b"hello "))
        sched.framework_message(driver, aid, eid, encode_output("other", "stdout", b"nope"))
        sched.framework_message(driver, aid, eid, encode_output("t", "stderr", b"warn"))
        sched.framework_message(driver, aid, eid, b"not an output payload")
        sched.framework_message(driver, aid, eid, encode_output("t", "stdout", b"world\n"))
        assert out.getvalue() == b"hello world\n"
        assert err.getvalue() == b"warn"

        sched.status_update(driver, _status(TaskState.RUNNING))
        assert not sched.final.done()
        sched.status_update(
            driver,
            TaskStatus(task_id=TaskID("x"), state=TaskState.FAILED, source=StatusSource.MASTER),
        )
        assert not sched.final.done()
        sched.status_update(driver, _status(TaskState.FAILED, 3))
        assert sched.final.result().exit_code == 3

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_run_scheduler_launches_again_when_its_offer_was_gone() -> None:
    async def scenario() -> None:
        opts = RunOptions(master="tcp://x:1", argv=("true",))
        sched = RunScheduler(opts, TaskID("t"), io.BytesIO(), io.BytesIO())
        driver = FakeDriver()
        sched.offers(driver, [_offer("first", "cpus:1;mem:64")])
        lost = _status(TaskState.LOST, reason=Reason.INVALID_OFFERS, message="offer rescinded")
        sched.status_update(driver, lost)
        assert not sched.final.done()
        assert ("revive", None) in driver.calls
        sched.offers(driver, [_offer("second", "cpus:1;mem:64")])
        launches = [args[0] for kind, args in driver.calls if kind == "launch"]
        assert launches == [OfferID("first"), OfferID("second")]
        sched.status_update(driver, _status(TaskState.FINISHED, 0))
        assert sched.final.result().state is TaskState.FINISHED
        sched.offers(driver, [_offer("third", "cpus:1;mem:64")])  # done: declined
        assert driver.calls[-1] == ("decline", (OfferID("third"),))

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_cli_error_carries_an_exit_code() -> None:
    assert CliError("x").code == 1
    assert CliError("usage", code=2).code == 2
