"""The executor zygote: a forked executor is what an exec'd one would be, to the agent (which
reaps it as a subreaper), to the agent after a restart (which finds it by its AGORA_SANDBOX in
/proc) and to itself (session, cwd, stdio, environment, command line); what a fork cannot honour
is declined; a dead zygote fails one spawn and is restarted by the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agora.agent.server.processes import BUILTIN_EXECUTOR_ARGV
from agora.agent.server.zygote import ROOM, Declined, ExecutorZygote
from support.polling import wait_for

TESTS = str(Path(__file__).resolve().parents[1])

# Runs in a child process that is a subreaper, as the agent is: spawns through a zygote whose
# entry is tests/support/zygote_entry.py, reaps the executor, prints what it saw.
DRIVER = textwrap.dedent(
    """
    import ctypes, json, os, signal, sys
    from agora.agent.server.processes import BUILTIN_EXECUTOR_ARGV, sandbox_process_alive
    from agora.agent.server.zygote import ExecutorZygote

    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    sandbox, kill_first = sys.argv[1], sys.argv[2] == "kill"
    env = dict(os.environ)
    zygote = ExecutorZygote(env, entry="support.zygote_entry:main", timeout=20)
    zygote.start()
    executor_env = {**env, "AGORA_SANDBOX": sandbox, "GREETING": "hi there"}
    def spawn():
        with open(os.path.join(sandbox, "stdin"), "rb") as i, \\
             open(os.path.join(sandbox, "out"), "ab") as o, \\
             open(os.path.join(sandbox, "err"), "ab") as e:
            return zygote.spawn(list(BUILTIN_EXECUTOR_ARGV), executor_env, sandbox,
                                i.fileno(), o.fileno(), e.fileno(), None)
    result = {}
    if kill_first:
        spawn()  # the zygote is up and serving
        os.waitpid(-1, 0)
        os.kill(zygote.pid, signal.SIGKILL)
        try:
            spawn()
            result["after_kill"] = "spawned"
        except OSError as exc:
            result["after_kill"] = "OSError"
    pid = spawn()
    result["alive_by_sandbox"] = sandbox_process_alive(pid, sandbox)
    _, status = os.waitpid(pid, 0)  # ours to reap: re-parented to us
    result["pid"] = pid
    result["code"] = os.waitstatus_to_exitcode(status)
    zygote.close()
    print(json.dumps(result))
    """
)


def _drive(sandbox: Path, *, kill_first: bool = False, **extra_env: str) -> dict[str, object]:
    (sandbox / "stdin").write_bytes(b"the input")
    env = {**os.environ, "PYTHONPATH": TESTS, **extra_env}
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(sandbox), "kill" if kill_first else "-"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, object] = json.loads(done.stdout.decode().splitlines()[-1])
    return result


def test_a_forked_executor_is_what_exec_would_have_made(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    result = _drive(sandbox)
    assert result["code"] == 7  # its exit status reaches the subreaper that reaps it
    assert result["alive_by_sandbox"] is True  # an agent after a restart would find it
    report = json.loads((sandbox / "report.json").read_text())
    assert report["pid"] == result["pid"]
    assert report["cwd"] == str(sandbox)
    assert report["session_leader"] is True
    assert report["stdin"] == "the input"
    assert (sandbox / "out").read_text() == "hello from the executor\n"
    assert report["environ"]["GREETING"] == "hi there"
    assert report["environ"]["AGORA_SANDBOX"] == str(sandbox)
    assert not any(k.startswith("AGORA_ZYGOTE") for k in report["environ"])
    # /proc shows the executor's own environment and command line, not the zygote's.
    assert f"AGORA_SANDBOX={sandbox}" in report["proc_environ"]
    assert "GREETING=hi there" in report["proc_environ"]
    assert not any(e.startswith("AGORA_ZYGOTE") for e in report["proc_environ"])
    assert report["cmdline"] == list(BUILTIN_EXECUTOR_ARGV)


def test_an_executor_that_crashes_says_why_and_exits_1(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    result = _drive(sandbox, ZYGOTE_TEST_CRASH="1")
    assert result["code"] == 1
    err = (sandbox / "err").read_text()
    assert "Traceback" in err and "the executor crashed" in err


def test_a_dead_zygote_fails_one_spawn_and_the_next_restarts_it(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    result = _drive(sandbox, kill_first=True)
    assert result["after_kill"] == "OSError"
    assert result["code"] == 7


def _declined(
    zygote: ExecutorZygote,
    env: dict[str, str],
    argv: list[str] | None = None,
    account: object | None = None,
) -> str:
    with pytest.raises(Declined) as caught:
        zygote.spawn(argv or list(BUILTIN_EXECUTOR_ARGV), env, "/nonexistent", 0, 1, 2, account)
    assert zygote.pid is None  # declined before anything was started
    return str(caught.value)


def test_what_a_fork_cannot_honour_is_declined() -> None:
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/a"}
    zygote = ExecutorZygote(base)
    assert "PYTHONPATH" in _declined(zygote, {**base, "PYTHONPATH": "/b"})
    assert "LD_PRELOAD" in _declined(zygote, {**base, "LD_PRELOAD": "/evil.so"})
    assert "larger" in _declined(zygote, {**base, "BIG": "x" * (ROOM + 1)})
    assert "another user" in _declined(zygote, base, account=object())
    assert "built-in" in _declined(zygote, base, argv=["/bin/sh", "-c", "true"])


def test_the_zygote_dies_with_its_parent() -> None:
    code = textwrap.dedent(
        """
        import os
        from agora.agent.server.zygote import ExecutorZygote
        z = ExecutorZygote(dict(os.environ))
        z.start()
        print(z.pid, flush=True)
        os._exit(0)  # no close: as if the agent were killed
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=30, check=True)
    pid = int(done.stdout.split()[0])

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except FileNotFoundError:
            return True

    wait_for(gone, timeout=10, what="the zygote to die with its parent")
