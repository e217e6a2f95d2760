"""How a shell command task is wrapped (``exec`` for one simple command), how its end is told
(exit status 128+N, the kill grace outcome), and how a process group is seen from /proc."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from agora.agent.executors.outcome import exit_message, kill_message
from agora.agent.executors.pgroup import group_alive
from agora.agent.executors.shell import shell_argv, with_exec
from support.polling import wait_for


@pytest.mark.parametrize(
    "command",
    [
        "sleep 5",
        "python3 -c 'import time; time.sleep(1)'",
        "sh -c 'trap \"echo bye\" TERM; while :; do sleep 1; done'",
        "python3 server.py --port 80 2>&1 >log",
        'echo_args "$(date; hostname)" ${HOME}',
        "python3 -c 'a = 1\nprint(a)'",
        "run # a comment",
    ],
)
def test_one_simple_command_is_execd(command: str) -> None:
    assert with_exec(command) == f"exec {command}"
    assert shell_argv(command) == ["/bin/sh", "-c", f"exec {command}"]


@pytest.mark.parametrize(
    "command",
    [
        "prepare; serve",
        "a && b",
        "a || b",
        "a | b",
        "serve &",
        "a &>log",
        "first\nsecond",
        "(cd x; run)",
        "echo $(a; b)",
        "X=1 run",
        "cd /tmp",
        "trap 'cleanup' TERM",
        "exit 3",
        "kill -USR1 $$",
        "echo hi",
        "if true; then run; fi",
        "2>/dev/null run",
        "'unbalanced",
        "",
        "   ",
    ],
)
def test_anything_else_is_left_to_the_shell(command: str) -> None:
    assert with_exec(command) == command


def test_exec_form_runs_the_command_as_the_shells_own_process() -> None:
    out = subprocess.run(
        shell_argv("sh -c 'echo $$ $PPID'"), capture_output=True, text=True, check=True
    )
    pid, parent = out.stdout.split()
    assert int(parent) == os.getpid()  # no shell in between
    assert int(pid) > 0


def test_exit_statuses_follow_the_shell_convention() -> None:
    assert exit_message(0) == "Command exited with status 0"
    assert exit_message(143) == "Command exited with status 143"
    assert exit_message(-signal.SIGTERM) == "Command terminated by signal SIGTERM (exit status 143)"
    assert exit_message(-signal.SIGKILL) == "Command terminated by signal SIGKILL (exit status 137)"
    assert exit_message(None) == "Command exit status unknown"


def test_a_kill_says_whether_the_task_ended_within_its_grace() -> None:
    assert kill_message(0, 3.0, escalated=False) == (
        "Command exited with status 0 within its 3 s kill grace period"
    )
    assert kill_message(-signal.SIGKILL, 1.5, escalated=True) == (
        "Command terminated by signal SIGKILL (exit status 137); "
        "SIGKILLed: still running when its 1.5 s kill grace period ran out"
    )
    assert kill_message(-signal.SIGKILL, 0.0, escalated=True) == (
        "Command terminated by signal SIGKILL (exit status 137); "
        "SIGKILLed at once (no kill grace period)"
    )
    assert kill_message(-signal.SIGTERM, 0.0, escalated=False) == (
        "Command terminated by signal SIGTERM (exit status 143) within no kill grace period"
    )
    assert kill_message(1, None, escalated=False) == "Command exited with status 1"


def test_a_group_is_alive_while_a_member_runs_though_its_leader_is_a_zombie() -> None:
    # The leader (sh) starts a member that outlives it, then exits; we do not reap it yet.
    with subprocess.Popen(
        ["sh", "-c", "sleep 30 & echo $!"], stdout=subprocess.PIPE, start_new_session=True
    ) as leader:
        try:
            assert leader.stdout is not None
            member = int(leader.stdout.readline())
            wait_for(lambda: _state(leader.pid) == "Z", 10, "the leader to become a zombie")
            assert group_alive(leader.pid)
            os.kill(member, signal.SIGKILL)
            wait_for(lambda: not group_alive(leader.pid), 10, "the group to be empty")
        finally:
            os.killpg(leader.pid, signal.SIGKILL)
    assert not group_alive(leader.pid)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]
