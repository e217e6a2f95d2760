"""Agent core: whom tasks run as, and root tasks refused unless --allow-root-tasks."""

from __future__ import annotations

from agora.agent.core import Action, LaunchExecutor
from agora.agent.core.run_as import TaskUsers
from agora.sdk.messages import (
    CommandInfo,
    FrameworkInfo,
    Reason,
    RunTask,
    RunTaskGroup,
    TaskGroupInfo,
    TaskState,
)
from msgspec.structs import replace
from support.agent_kit import (
    FID,
    AgentHarness,
    config,
    executor_info,
    forwarded,
    of_type,
    only,
    task_info,
)


def _agent(**users: object) -> AgentHarness:
    h = AgentHarness(cfg=config(task_users=TaskUsers(**users)))  # type: ignore[arg-type]
    h.register()
    return h


def _run(h: AgentHarness, task_user: str = "", framework_user: str = "") -> list[Action]:
    task = task_info("t1")
    assert task.command is not None
    task = replace(task, command=replace(task.command, user=task_user))
    info = FrameworkInfo(name="fw", user=framework_user)
    return h.master(RunTask(framework_info=info, framework_id=FID, task=task, role="*"))


def _refused(out: list[Action]) -> str:
    update = only(forwarded(out))
    status = update.status
    assert (status.state, status.reason) == (TaskState.ERROR, Reason.TASK_UNAUTHORIZED)
    assert not of_type(out, LaunchExecutor)
    return status.message or ""


def test_root_tasks_are_refused_without_the_flag() -> None:
    h = _agent(agent_user="root")
    assert "--allow-root-tasks" in _refused(_run(h, task_user="root", framework_user="alice"))
    assert h.st.tasks == {}


def test_no_user_anywhere_is_not_run_as_a_root_agent() -> None:
    h = _agent(agent_user="root")
    assert "'root'" in _refused(_run(h))


def test_root_tasks_run_with_the_flag() -> None:
    h = _agent(agent_user="root", allow_root_tasks=True)
    out = _run(h, task_user="root")
    assert only(of_type(out, LaunchExecutor)).builtin
    assert not forwarded(out)


def test_the_framework_user_then_the_default_task_user_is_whom_executors_run_as() -> None:
    h = _agent(agent_user="root")
    assert only(of_type(_run(h, framework_user="alice"), LaunchExecutor)).user == "alice"
    h = _agent(agent_user="root", default_task_user="nobody")
    assert only(of_type(_run(h), LaunchExecutor)).user == "nobody"


def test_switch_user_off_runs_as_the_agent_user() -> None:
    h = _agent(agent_user="agora", switch_user=False)
    out = _run(h, task_user="root")  # runs as "agora", the agent's own user: not refused
    assert only(of_type(out, LaunchExecutor)).builtin
    h = _agent(agent_user="root", switch_user=False)
    assert "--no-switch-user" in _refused(_run(h, task_user="nobody"))


def test_a_group_on_an_executor_running_as_root_is_refused_whole() -> None:
    h = _agent(agent_user="root")
    executor = executor_info()
    tasks = (task_info("g1", command=True), task_info("g2", command=True))
    tasks = (tasks[0], replace(tasks[1], command=CommandInfo(value="x", user="root")))
    info = FrameworkInfo(name="fw", user="alice")
    out = h.master(
        RunTaskGroup(
            framework_info=info,
            framework_id=FID,
            executor=executor,
            task_group=TaskGroupInfo(tasks=tasks),
        )
    )
    updates = forwarded(out)
    assert {u.status.task_id for u in updates} == {"g1", "g2"}
    assert all(u.status.reason is Reason.TASK_UNAUTHORIZED for u in updates)
    assert not of_type(out, LaunchExecutor)
