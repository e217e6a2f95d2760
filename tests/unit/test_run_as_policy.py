"""Who may run tasks as whom: the ACL's [run_as] rule (pure) and the agent's task-user flags."""

from __future__ import annotations

import os

import pytest
from agora.agent.core.run_as import TaskUsers
from agora.master.core.run_as import RunAsPolicy, effective_users
from agora.master.server.process import run_as_policy
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import CommandInfo, ExecutorInfo, TaskInfo
from agora.sdk.resources import Resources
from agora.sdk.transport import Acl
from agora.sdk.transport.curve import AclError

POLICY = RunAsPolicy(
    users={"alice": ("alice", "nobody"), "ops": ("*",), "*": ("nobody",)},
    defaults={"ops": "daemon"},
)


def _task(user: str = "", executor_user: str | None = None) -> TaskInfo:
    executor = None
    if executor_user is not None:
        executor = ExecutorInfo(
            executor_id=ExecutorID("e1"),
            framework_id=FrameworkID("f1"),
            command=CommandInfo(value="x", user=executor_user),
        )
    return TaskInfo(
        task_id=TaskID("t1"),
        name="t1",
        agent_id=AgentID("a1"),
        resources=Resources.parse("cpus:1"),
        command=None if executor is not None else CommandInfo(value="id -un", user=user),
        executor=executor,
    )


def test_principal_runs_only_as_its_users_and_the_star_key_is_the_default() -> None:
    assert POLICY.problem("alice", "nobody") is None
    assert POLICY.problem("ops", "root") is None
    problem = POLICY.problem("alice", "root")
    assert problem == (
        "ACL run_as: principal 'alice' may not run tasks as user 'root' "
        "(allowed: 'alice', 'nobody')"
    )
    assert POLICY.problem("mallory", "nobody") is None  # the "*" key
    assert POLICY.problem("mallory", "alice") is not None
    assert POLICY.problem(None, "nobody") is None  # CURVE off matches only "*"
    assert "no principal (CURVE off)" in (POLICY.problem(None, "root") or "")
    assert RunAsPolicy(users={"alice": ("alice",)}).problem("bob", "bob") is not None


def test_default_user_is_the_table_entry_else_the_first_allowed_user() -> None:
    assert POLICY.default_user("ops") == "daemon"
    assert POLICY.default_user("alice") == "alice"
    assert POLICY.default_user("mallory") == "nobody"
    assert RunAsPolicy(users={"ops": ("*",)}).default_user("ops") is None
    assert "no default_user" in (POLICY.problem("ops", None) or "")


def test_effective_users_fall_back_from_task_to_executor_to_framework() -> None:
    assert effective_users(_task("alice"), None, "fwuser") == ("alice",)
    assert effective_users(_task(""), None, "fwuser") == ("fwuser",)
    assert effective_users(_task(executor_user="root"), None, "fwuser") == ("root",)
    assert effective_users(_task(executor_user=""), None, None) == (None,)


def test_acl_file_tables_become_the_policy() -> None:
    acl = Acl.from_dict(
        {
            "run_as": {"alice": ["alice", "nobody", "alice"], "*": ["nobody"]},
            "default_user": {"alice": "nobody"},
        }
    )
    assert acl.run_as == {"alice": ("alice", "nobody"), "*": ("nobody",)}
    policy = run_as_policy(acl)
    assert policy is not None and policy.default_user("alice") == "nobody"
    assert run_as_policy(Acl.from_dict({})) is None
    assert run_as_policy(None) is None
    with pytest.raises(AclError, match="run_as"):
        Acl.from_dict({"run_as": {"alice": "root"}})
    with pytest.raises(AclError, match="default_user"):
        Acl.from_dict({"default_user": {"alice": "*"}})


ROOT_AGENT = TaskUsers(agent_user="root", root_users=frozenset({"root", "toor"}))


def test_agent_refuses_root_tasks_unless_allowed() -> None:
    assert "--allow-root-tasks" in (ROOT_AGENT.problem(_task("root"), None, "") or "")
    assert ROOT_AGENT.problem(_task("toor"), None, "") is not None  # another name of uid 0
    # No user anywhere: the agent's own identity, root here, is refused too.
    assert ROOT_AGENT.problem(_task(""), None, "") is not None
    assert ROOT_AGENT.problem(_task(executor_user=""), None, "") is not None
    assert ROOT_AGENT.problem(_task(""), None, "nobody") is None
    defaulted = TaskUsers(agent_user="root", default_task_user="nobody")
    assert defaulted.problem(_task(""), None, "") is None
    allowed = TaskUsers(agent_user="root", allow_root_tasks=True)
    assert allowed.problem(_task("root"), None, "") is None
    assert TaskUsers(agent_user="agora").problem(_task(""), None, "") is None


def test_switch_user_off_runs_every_task_as_the_agent() -> None:
    off = TaskUsers(switch_user=False, agent_user="agora")
    assert off.users_of(_task("root"), None, "alice") == ("agora",)
    assert off.problem(_task("root"), None, "") is None
    root_off = TaskUsers(switch_user=False, agent_user="root")
    assert "--no-switch-user" in (root_off.problem(_task("nobody"), None, "") or "")


def test_command_executor_of_a_no_switch_user_agent_runs_tasks_as_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agora.agent.executors.command import CommandExecutor

    task = _task("nobody")
    monkeypatch.setenv("AGORA_SWITCH_USER", "0")
    assert CommandExecutor()._check(task) == (None, None)
    monkeypatch.delenv("AGORA_SWITCH_USER")
    problem, run_as = CommandExecutor()._check(task)
    if os.geteuid() == 0:
        assert problem is None and run_as is not None and run_as.name == "nobody"
    else:
        assert problem is not None and "not root" in problem
