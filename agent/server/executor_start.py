"""Starting one executor process: what it runs, with what, as whom, and the start itself.

An executor's command line (ours for the built-in and default executors, else its CommandInfo),
its environment, its sandbox (resolved inside the work dir, never escaping it) and the account it
runs as are decided here; :func:`start_executor` then starts it in that sandbox, with
``executor.stdout``/``executor.stderr`` there, in one of three ways: a container's starter when
there is one, else the zygote's fork (a fork of a warm process, see
:mod:`agora.agent.server.zygote`) when offered and willing, else exec in a session of its own.
Watching it afterwards is :mod:`agora.agent.server.processes`'s part.
"""

from __future__ import annotations

import os
import pwd
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

import structlog
from agora.agent.server.zygote import Declined
from agora.sdk.messages import ExecutorInfo

__all__ = [
    "BUILTIN_EXECUTOR_ARGV",
    "MESOS_BRIDGE_ARGV",
    "Account",
    "ExecutorStarter",
    "LaunchError",
    "account_for",
    "executor_argv",
    "executor_environment",
    "resolve_sandbox",
    "runs_default_executor",
    "start_executor",
]

log = structlog.get_logger(__name__)

BUILTIN_EXECUTOR_ARGV: tuple[str, ...] = (sys.executable, "-m", "agora.agent.executors.command")
#: Runs an executor that speaks the Mesos v1 executor HTTP API (its command line follows).
MESOS_BRIDGE_ARGV: tuple[str, ...] = (sys.executable, "-m", "agora.agent.executors.mesos_bridge")

#: Starts an executor in a container: (argv, env, sandbox, stdin, stdout, stderr, account) ->
#: the pid to watch (a child of the agent, which is a subreaper). Raises on failure.
ExecutorStarter = Callable[
    [list[str], Mapping[str, str], str, int, int, int, "Account | None"], int
]


class LaunchError(Exception):
    """An executor could not be started; ``str(error)`` says why (goes to the core)."""


@dataclass(frozen=True, slots=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def resolve_sandbox(work_dir: str, relative: str) -> str:
    """The absolute sandbox ``relative`` names inside ``work_dir``; raises LaunchError if it
    would escape it (absolute paths, ``..``, symlinks pointing out)."""
    root = os.path.realpath(work_dir)
    if not relative or os.path.isabs(relative) or "\x00" in relative:
        raise LaunchError(f"bad sandbox path {relative!r}: must be relative to the work dir")
    path = os.path.realpath(os.path.join(root, relative))
    if path == root or os.path.commonpath([root, path]) != root:
        raise LaunchError(f"bad sandbox path {relative!r}: escapes the work dir")
    return path


def runs_default_executor(info: ExecutorInfo) -> bool:
    """An ExecutorInfo that names no command runs the built-in executor (Mesos's DEFAULT
    executor): task groups that need no executor of their own."""
    return not info.command.value and not info.command.argv


def executor_argv(info: ExecutorInfo, builtin: bool) -> list[str]:
    """The command line of an executor: ours for the built-in and default ones, else its
    CommandInfo."""
    if builtin or runs_default_executor(info):
        return list(BUILTIN_EXECUTOR_ARGV)
    command = info.command
    if info.mesos:  # the bridge runs the command, through the shell
        line = command.value if command.shell and command.value else shlex.join(command.argv)
        return [*MESOS_BRIDGE_ARGV, line or str(command.value)]
    if command.shell and command.value:
        return ["/bin/sh", "-c", command.value]
    return list(command.argv) if command.argv else [str(command.value)]


def executor_environment(
    inherited: Mapping[str, str],
    *,
    drop: frozenset[str],
    info: ExecutorInfo,
    given: Mapping[str, str],
    required: Mapping[str, str],
) -> dict[str, str]:
    """``inherited`` minus ``drop``, then the executor command's environment, then what the core
    ``given``, then the ``required`` variables the daemon alone knows (endpoint, sandbox...)."""
    env = {k: v for k, v in inherited.items() if k not in drop}
    env.update(info.command.environment)
    env.update(given)
    env.update(required)
    return env


def account_for(user: str | None, *, switch_user: bool) -> Account | None:
    """The account to switch to, None to run as the agent's own user."""
    if not user:
        return None
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise LaunchError(f"unknown user {user!r}") from None
    if entry.pw_uid == os.geteuid():
        return None
    if not switch_user:
        return None
    if os.geteuid() != 0:
        raise LaunchError(
            f"cannot run as user {user!r}: the agent is not root (see --no-switch-user)"
        )
    try:
        groups = tuple(os.getgrouplist(user, entry.pw_gid))
    except OSError:
        groups = (entry.pw_gid,)
    return Account(user, entry.pw_uid, entry.pw_gid, groups)


def start_executor(
    argv: Sequence[str],
    sandbox: str,
    env: Mapping[str, str],
    account: Account | None,
    starter: ExecutorStarter | None,
    fork_starter: ExecutorStarter | None,
) -> tuple[int, subprocess.Popen[bytes] | None]:
    """Start ``argv`` in ``sandbox`` (absolute, created here): (its pid, its Popen when it was
    started by exec, else None). Raises LaunchError."""
    pid = 0
    popen: subprocess.Popen[bytes] | None = None
    try:
        os.makedirs(sandbox, exist_ok=True)
        if os.path.realpath(sandbox) != sandbox:
            raise LaunchError(f"sandbox {sandbox} is behind a symlink")
        if account is not None:
            os.chown(sandbox, account.uid, account.gid)
        with (
            open(os.path.join(sandbox, "executor.stdout"), "ab") as out,
            open(os.path.join(sandbox, "executor.stderr"), "ab") as err,
            open(os.devnull, "rb") as null,
        ):
            if starter is None and fork_starter is not None:
                pid = _try_fork_starter(fork_starter, argv, env, sandbox, (null, out, err), account)
            if starter is not None:
                pid = starter(
                    list(argv), env, sandbox, null.fileno(), out.fileno(), err.fileno(), account
                )
            elif not pid:
                popen = subprocess.Popen(
                    list(argv),
                    cwd=sandbox,
                    env=dict(env),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    close_fds=True,
                    start_new_session=True,
                    user=account.uid if account else None,
                    group=account.gid if account else None,
                    extra_groups=list(account.groups) if account else None,
                )
    except LaunchError:
        raise
    except Exception as exc:  # OSError, ValueError, SubprocessError, a starter's own error
        raise LaunchError(f"cannot start executor {argv[0] if argv else ''!r}: {exc}") from exc
    if popen is not None:
        pid = popen.pid
    return pid, popen


def _try_fork_starter(
    starter: ExecutorStarter,
    argv: Sequence[str],
    env: Mapping[str, str],
    sandbox: str,
    stdio: tuple[IO[bytes], IO[bytes], IO[bytes]],
    account: Account | None,
) -> int:
    """The pid ``starter`` forked, or 0 when it declined or failed (then exec starts it)."""
    null, out, err = stdio
    try:
        return starter(list(argv), env, sandbox, null.fileno(), out.fileno(), err.fileno(), account)
    except Declined as exc:
        log.info("executor_zygote_declined", sandbox=sandbox, why=str(exc))
    except OSError as exc:
        log.warning("executor_zygote_failed", sandbox=sandbox, error=str(exc))
    return 0
