"""Start-up discipline: each path of the ``agora`` CLI and the SDK's driver imports only what it
needs. Each case runs ``python -X importtime`` in a fresh interpreter (nothing of this test process
leaks in) and reads which modules that path loaded from its ``sys.modules`` at the end (importtime
also lists imports that failed on purpose, such as structlog's of rich); a failure shows the
slowest imports."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from agora.sdk.cli import main as cli_main_function  # noqa: F401  (the package's re-export)
from agora.sdk.cli.main import _BUILTIN, build_parser

#: What no path below may load: HTTP servers and clients, metrics, and the terminal UI library
#: (which structlog pulls in for pretty tracebacks unless kept out).
HEAVY = ("aiohttp", "prometheus_client", "rich")


class Imported(set[str]):
    """The modules a path loaded, and the importtime report (its slowest lines in repr)."""

    report: str

    def __repr__(self) -> str:
        rows = [r for r in self.report.splitlines() if r.startswith("import time:") and "|" in r]
        rows = [r for r in rows if r.split("|")[1].strip().isdigit()]
        slowest = sorted(rows, key=lambda r: -int(r.split("|")[1]))[:15]
        return f"<{len(self)} modules; slowest (us, cumulative):\n" + "\n".join(slowest) + ">"


def imported_by(code: str) -> Imported:
    """The modules a fresh interpreter has loaded after running ``code``."""
    code += "\nimport sys as _s\nprint('\\n'.join(sorted(_s.modules)), file=_s.__stdout__)\n"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    names = Imported(line for line in done.stdout.splitlines() if line)
    names.report = done.stderr
    return names


def cli(*argv: str) -> str:
    # argparse exits after --help, the modules all loaded; its output must not mix with ours.
    return (
        "import contextlib, io\n"
        "from agora.sdk.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({list(argv)!r})\n"
    )


def heavy_in(names: Imported) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in HEAVY)


def test_agora_help_imports_no_subcommand() -> None:
    names = imported_by(cli("--help"))
    assert heavy_in(names) == []
    loaded = {n for n in names if n.startswith("agora.sdk.cli.") and n != "agora.sdk.cli.main"}
    assert loaded == set()
    assert "structlog" not in names and "zmq" not in names and "importlib.metadata" in names


def test_agora_run_imports_only_the_driver_path() -> None:
    # `run --help` builds exactly the parser `agora run -- CMD` does, without a master.
    names = imported_by(cli("run", "--help"))
    assert heavy_in(names) == []
    assert "agora.sdk.scheduler.driver" in names  # the path is really there
    for unneeded in (
        "agora.sdk.cli.top",
        "agora.sdk.cli.local",
        "agora.sdk.cli.logs",  # the sandbox reader: only after a failover lost output
        "agora.sdk.executor.driver",
        "urllib.request",
        "importlib.metadata",  # plugins: only for a command that is none of the built-ins
    ):
        assert unneeded not in names, unneeded


def test_the_scheduler_driver_imports_without_rich() -> None:
    names = imported_by("from agora.sdk import SchedulerDriver, TaskSpec, Scheduler")
    assert heavy_in(names) == []
    assert "structlog" in names


def test_a_command_that_draws_still_gets_rich() -> None:
    names = imported_by(cli("local", "--help"))
    assert "rich.console" in names


@pytest.mark.parametrize("command", sorted(_BUILTIN))
def test_the_help_lines_listed_lazily_are_the_commands_own(command: str) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {action.dest: action.help for action in sub._choices_actions}
    assert _BUILTIN[command][1] == helps[command]


def test_every_builtin_command_is_listed() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    plugins = set(cli_main_module()._plugin_points())
    assert set(sub.choices) - plugins == set(_BUILTIN)


def cli_main_module():  # type: ignore[no-untyped-def]
    return sys.modules["agora.sdk.cli.main"]


def test_the_command_executor_imports_no_heavy_module() -> None:
    # The agent starts it as a process (python -m) for a framework's first task on an agent:
    # everything it imports is on the path of `agora run`'s ACCEPT -> RUNNING.
    names = imported_by("import agora.agent.executors.command")
    assert heavy_in(names) == []
    assert "structlog" in names and "agora.sdk.executor.driver" in names  # the path is there
    for unneeded in (
        "agora.agent.containers.fetcher",  # only for a task with URIs
        "urllib.request",
        "agora.sdk.scheduler",
        "agora.sdk.cli",
    ):
        assert unneeded not in names, unneeded


def test_the_codec_builds_no_message_schema_at_import() -> None:
    # compiled per class on first use: a process pays only for the messages it speaks
    code = (
        "from agora.sdk import codec\n"
        "from agora.sdk.messages._schema import _CACHE\n"
        "assert not codec._ENCODERS and not _CACHE, sorted(c.__name__ for c in _CACHE)\n"
    )
    imported_by(code)


def test_the_executor_driver_imports_without_rich() -> None:
    # an executor written on the SDK (and an MPI member) starts as a process for its tasks
    names = imported_by("from agora.sdk.executor import Executor, run_executor")
    assert heavy_in(names) == []
    assert "structlog" in names


def test_the_mpi_member_executor_imports_no_heavy_module() -> None:
    # The agent starts one as a process on every gang agent of every `agora mpirun`: what it
    # imports is on the path of each MPI job (structlog's rich tracebacks were ~60 ms of it).
    names = imported_by("import agora.frameworks.mpi.executor")
    assert heavy_in(names) == []
    assert "structlog" in names and "agora.sdk.executor.driver" in names  # the path is there
    for unneeded in ("agora.sdk.scheduler", "agora.sdk.cli", "agora.frameworks.mpi.scheduler"):
        assert unneeded not in names, unneeded
