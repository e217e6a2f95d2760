"""Health checks: command, HTTP and TCP probes, the grace period, timeouts and clean stops."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from agora.agent.executors.health import HealthChecker, health_check_problem
from agora.sdk.cli.cluster import free_ports
from agora.sdk.messages.container import HealthCheck, HealthCheckKind

FAST = {"delay": 0.0, "interval": 0.05, "timeout": 2.0, "grace_period": 0.0}


class Recorder:
    def __init__(self) -> None:
        self.changes: list[bool] = []
        self.unhealthy: list[str] = []

    def checker(self, check: HealthCheck, sandbox: Path) -> HealthChecker:
        return HealthChecker(
            check,
            sandbox=str(sandbox),
            env=dict(os.environ),
            on_change=self.changes.append,
            on_unhealthy=self.unhealthy.append,
        )


async def until(predicate: Callable[[], object], timeout: float = 5.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(coro: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(coro(), 15))


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead too
    except FileNotFoundError:
        return True


def test_command_check_flips_healthy_then_unhealthy_then_gives_up(tmp_path: Path) -> None:
    # Healthy while the flag file exists; the 3rd failure in a row declares the task unhealthy.
    (tmp_path / "ok").touch()
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND, command="test -e ok", consecutive_failures=3, **FAST
    )
    rec = Recorder()

    async def main() -> None:
        checker = rec.checker(check, tmp_path)
        checker.start()
        await until(lambda: rec.changes == [True], what="healthy")
        (tmp_path / "ok").unlink()
        await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert rec.changes == [True, False]
        assert checker.consecutive_failures == 3
        assert "3 consecutive" in rec.unhealthy[0] and "status 1" in rec.unhealthy[0]
        await until(lambda: not checker.running, what="checker stopped itself")
        assert rec.changes == [True, False] and len(rec.unhealthy) == 1

    run(main)


def test_recovery_resets_the_failure_count(tmp_path: Path) -> None:
    # Probes: fail, fail, ok, fail, fail, fail -> unhealthy only after the last three in a row.
    script = tmp_path / "probe.sh"
    script.write_text('n=$(cat count 2>/dev/null || echo 0); echo $((n+1)) > count; [ "$n" = 2 ]\n')
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND, command="sh probe.sh", consecutive_failures=3, **FAST
    )
    rec = Recorder()

    async def main() -> None:
        rec.checker(check, tmp_path).start()
        await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert rec.changes == [False, True, False]
        assert (tmp_path / "count").read_text().strip() == "6"

    run(main)


def test_grace_period_ignores_early_failures(tmp_path: Path) -> None:
    # consecutive_failures=1: any counted failure would end it at once.
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND,
        command="echo x >> probes; false",
        consecutive_failures=1,
        delay=0.0,
        interval=0.05,
        timeout=2.0,
        grace_period=0.5,
    )
    rec = Recorder()

    async def main() -> None:
        started = time.monotonic()
        rec.checker(check, tmp_path).start()
        await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert time.monotonic() - started >= 0.5
        assert len((tmp_path / "probes").read_text().split()) >= 3  # early failures ignored
        assert rec.changes == [False]

    run(main)


def test_grace_period_ends_at_first_success(tmp_path: Path) -> None:
    (tmp_path / "ok").touch()
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND,
        command="test -e ok",
        consecutive_failures=1,
        delay=0.0,
        interval=0.05,
        timeout=2.0,
        grace_period=60.0,
    )
    rec = Recorder()

    async def main() -> None:
        rec.checker(check, tmp_path).start()
        await until(lambda: rec.changes == [True], what="healthy")
        (tmp_path / "ok").unlink()
        await until(lambda: rec.unhealthy, what="failure counted inside the grace period")

    run(main)


def test_http_check_against_local_server(tmp_path: Path) -> None:
    statuses = [200, 200, 500]
    paths: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\r\n\r\n")
        paths.append(request.split()[1].decode())
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        writer.write(f"HTTP/1.1 {status} X\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()

    rec = Recorder()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        check = HealthCheck(
            kind=HealthCheckKind.HTTP,
            port=port,
            path="/health?x=1",
            consecutive_failures=2,
            **FAST,
        )
        async with server:
            rec.checker(check, tmp_path).start()
            await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert rec.changes == [True, False]
        assert "HTTP 500" in rec.unhealthy[0]
        assert set(paths) == {"/health?x=1"} and len(paths) == 4

    run(main)


def test_tcp_check_against_listener_then_closed(tmp_path: Path) -> None:
    rec = Recorder()

    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        check = HealthCheck(kind=HealthCheckKind.TCP, port=port, consecutive_failures=2, **FAST)
        checker = rec.checker(check, tmp_path)
        checker.start()
        await until(lambda: rec.changes == [True], what="healthy")
        server.close()
        await server.wait_closed()
        await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert rec.changes == [True, False]
        assert "refused" in rec.unhealthy[0].lower()

    run(main)


def test_hanging_command_is_killed_at_timeout_and_counts_as_failure(tmp_path: Path) -> None:
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND,
        command="echo $$ > pid; sleep 30 & wait",
        consecutive_failures=1,
        delay=0.0,
        interval=0.05,
        timeout=0.3,
        grace_period=0.0,
    )
    rec = Recorder()

    async def main() -> None:
        started = time.monotonic()
        rec.checker(check, tmp_path).start()
        await until(lambda: rec.unhealthy, what="on_unhealthy")
        assert 0.3 <= time.monotonic() - started < 5
        assert "timed out" in rec.unhealthy[0]
        shell = int((tmp_path / "pid").read_text())
        # The whole process group is gone, the background sleep included.
        await until(lambda: pid_gone(shell), what="shell reaped")
        await until(lambda: not _group_members(shell), what="group killed")

    run(main)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


def test_stop_kills_the_running_probe_and_leaves_no_process(tmp_path: Path) -> None:
    check = HealthCheck(
        kind=HealthCheckKind.COMMAND,
        command="echo $$ > pid; sleep 30 & wait",
        delay=0.0,
        interval=0.05,
        timeout=30.0,
        grace_period=0.0,
    )
    rec = Recorder()

    async def main() -> None:
        checker = rec.checker(check, tmp_path)
        checker.start()
        await until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text())
        shell = int((tmp_path / "pid").read_text())
        await until(lambda: len(_group_members(shell)) == 2, what="sleep started")
        checker.stop()
        await until(lambda: not checker.running, what="checker task ended")
        await until(lambda: pid_gone(shell) and not _group_members(shell), what="group gone")
        assert rec.changes == [] and rec.unhealthy == []

    run(main)


def test_stop_during_delay_runs_no_probe(tmp_path: Path) -> None:
    check = HealthCheck(kind=HealthCheckKind.COMMAND, command="touch probed", delay=0.2)
    rec = Recorder()

    async def main() -> None:
        checker = rec.checker(check, tmp_path)
        checker.start()
        checker.stop()
        await until(lambda: not checker.running)
        assert not (tmp_path / "probed").exists()

    run(main)


@pytest.mark.parametrize(
    ("check", "problem"),
    [
        (HealthCheck(kind=HealthCheckKind.COMMAND), "needs a command"),
        (HealthCheck(kind=HealthCheckKind.COMMAND, command="  "), "needs a command"),
        (HealthCheck(kind=HealthCheckKind.HTTP), "needs a port"),
        (HealthCheck(kind=HealthCheckKind.TCP), "needs a port"),
        (HealthCheck(kind=HealthCheckKind.TCP, port=0), "not in 1-65535"),
        (HealthCheck(kind=HealthCheckKind.HTTP, port=80, path="health"), "start with '/'"),
        (HealthCheck(kind=HealthCheckKind.HTTP, port=80, path="/a b"), "spaces"),
        (HealthCheck(kind=HealthCheckKind.TCP, port=80, interval=0), "interval"),
        (HealthCheck(kind=HealthCheckKind.TCP, port=80, timeout=-1), "timeout"),
        (HealthCheck(kind=HealthCheckKind.TCP, port=80, consecutive_failures=0), "at least 1"),
    ],
)
def test_health_check_problem_names_the_fault(check: HealthCheck, problem: str) -> None:
    found = health_check_problem(check)
    assert found is not None and problem in found
    with pytest.raises(ValueError, match=problem.split("'")[0]):
        HealthChecker(check, sandbox=".", env={}, on_change=print, on_unhealthy=print)


@pytest.mark.parametrize(
    "check",
    [
        HealthCheck(kind=HealthCheckKind.COMMAND, command="true"),
        HealthCheck(kind=HealthCheckKind.HTTP, port=8080, path="/health?ready=1"),
        HealthCheck(kind=HealthCheckKind.TCP, port=1),
    ],
)
def test_valid_checks_have_no_problem(check: HealthCheck) -> None:
    assert health_check_problem(check) is None


def test_tcp_check_on_closed_port_is_unhealthy(tmp_path: Path) -> None:
    rec = Recorder()
    check = HealthCheck(
        kind=HealthCheckKind.TCP, port=free_ports(1)[0], consecutive_failures=1, **FAST
    )

    async def main() -> None:
        rec.checker(check, tmp_path).start()
        await until(lambda: rec.unhealthy)
        assert rec.changes == [False]

    run(main)
