"""``agora``: argument parsing and dispatch to the subcommands."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agora.sdk._lean import import_structlog_without_rich

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["build_parser", "main"]

_Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

#: The built-in subcommands, in ``agora --help`` order: the module (under ``agora.sdk.cli``) whose
#: ``add_parser``/``add_parsers`` registers each, and its one-line help. A command imports only its
#: own module (``agora run`` never loads rich or the console); ``agora --help`` imports none of
#: them. tests/unit/test_cli_lazy.py holds these lines to the modules' own.
_BUILTIN: dict[str, tuple[str, str]] = {
    "local": ("local", "run a master and agents on this machine until Ctrl-C"),
    "run": ("run", "run one command as a task and relay its output (like mesos-execute)"),
    "state": ("show", "the master's whole state: agents, frameworks, tasks"),
    "agents": ("show", "the agents registered with the master"),
    "tasks": ("show", "tasks the master knows (live ones unless --all)"),
    "roles": ("show", "the roles the master knows: weight, quota guarantee and limit, share"),
    "kill": ("kill", "kill a task (operator call)"),
    "weights": ("operate", "set the DRF weight of roles (operator call)"),
    "quota": ("operate", "set or remove a role's quota (operator call)"),
    "drain": ("operate", "stop offering an agent's resources (operator call)"),
    "reactivate": ("operate", "offer a drained agent's resources again (operator call)"),
    "reserve": ("reserve", "reserve free resources of an agent to a role (operator call)"),
    "unreserve": ("reserve", "give back resources reserved to a role (operator call)"),
    "maintenance": (
        "maintenance",
        "plan maintenance windows of agents; inverse offers (operator calls)",
    ),
    "gone": ("operate", "remove an agent for good (operator call; irreversible, needs --yes)"),
    "teardown": ("operate", "remove a framework and kill its tasks (operator call; needs --yes)"),
    "logs": ("logs", "print a task's stdout or stderr"),
    "top": ("top", "a live console: utilization, agents, frameworks, tasks, events (q quits)"),
    "keys": ("keys", "CURVE keys for a master with authentication on"),
    "image": ("image", "root filesystems for containers (import, list, rm)"),
}


def _registrar(module: str) -> _Registrar:
    import_structlog_without_rich()
    mod = importlib.import_module(f"agora.sdk.cli.{module}")
    found: _Registrar = getattr(mod, "add_parsers", None) or mod.add_parser
    return found


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` (importlib.metadata is loaded only when plugins are)."""
    from importlib.metadata import entry_points as _entry_points

    return list(_entry_points(group=group))


_EPILOG = """\
The master is found from --master, else $AGORA_MASTER, else $AGORA_HOME/master (written by
`agora local`; AGORA_HOME defaults to ~/.agora), else tcp://127.0.0.1:5050.

examples:
  agora local --agents 3                 # a cluster on this machine, until Ctrl-C
  agora run -- echo hello                # one task; its output here; its exit code
  agora run --cpus 1 --mem 256 -- sh -c 'make -j4 && ./test'
  agora tasks --all                      # live and finished tasks
  agora state --json | jq '.agents[].hostname'
  agora roles                            # weights, quota, dominant share per role
  agora top                              # a live console of the cluster; q quits
  agora kill agora-run-1a2b3c4d
  agora drain AGENT_ID                   # no new offers there; `agora reactivate` undoes it
  agora drain AGENT_ID --deadline 30m    # ... and kill what still runs there in 30 minutes
  agora maintenance schedule AGENT_ID --start +1h --duration 2h   # inverse offers, then drain
  agora weights batch=3 analytics=1      # DRF weights per role
  agora quota batch --guarantee 'cpus:4;mem:8192' --limit cpus:8   # --remove takes it away
  agora teardown FRAMEWORK_ID --yes      # kill a framework's tasks and remove it
  agora logs --follow agora-run-1a2b3c4d # a task's stdout, through its agent (--stderr)

With CURVE on at the master, the commands that talk to it take --curve-secret-key FILE (this
client's NAME.key_secret) and --curve-server-key FILE (the master's public key), else
$AGORA_CURVE_SECRET_KEY and $AGORA_CURVE_SERVER_KEY; `agora keys generate NAME` makes keys.
"""


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every built-in subcommand and every plugin's, each fully described."""
    parser, sub = _top_parser()
    for module in dict.fromkeys(module for module, _ in _BUILTIN.values()):
        _registrar(module)(sub)
    _add_plugins(sub)
    return parser


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """A parser that knows in full only the subcommand ``argv`` names, importing nothing else.

    With no subcommand (``agora``, ``agora --help``) the built-ins are listed from
    :data:`_BUILTIN` and the plugins by their entry points' names, none of them loaded; a word
    that is neither gets the whole parser (for its error message)."""
    command = argv[0] if argv and not argv[0].startswith("-") else None
    parser, sub = _top_parser()
    if command in _BUILTIN:
        _registrar(_BUILTIN[command][0])(sub)
        return parser
    if command is not None:
        points = _plugin_points()
        if command in points:
            _load_plugin(points[command], sub)
            return parser
        return build_parser()
    for name, (_, help_) in _BUILTIN.items():
        sub.add_parser(name, help=help_, add_help=False)
    for name, point in _plugin_points().items():
        sub.add_parser(name, help=f"(from {point.module}; agora {name} --help)", add_help=False)
    return parser


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[Any]]:
    parser = argparse.ArgumentParser(
        prog="agora",
        description="Agora: a resource-offer cluster manager in the model of Apache Mesos.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print agora's version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    return parser, sub


#: The distribution (``pip install agora-cluster``) whose metadata holds the version; the import
#: name is ``agora``, taken on PyPI by another project.
DISTRIBUTION = "agora-cluster"


def version() -> str:
    """The installed distribution's version (importlib.metadata is loaded only when asked)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version(DISTRIBUTION)
    except PackageNotFoundError:
        return f"(unknown: the {DISTRIBUTION} distribution is not installed)"


class _Version(argparse.Action):
    """``agora --version``: prints ``agora <version>`` and exits 0, looking the version up only
    then (argparse's own ``version`` action wants it while the parser is built, on every path)."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"agora {version()}")
        parser.exit()


#: The entry-point group of subcommands that other packages add to ``agora`` (each entry point is
#: a function called with the subparsers, like the ``add_parser`` of the built-in ones).
PLUGIN_GROUP = "agora.cli"


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of every ``agora.cli`` entry point, by name; one that fails to load is
    left out with a warning, never breaking ``agora``."""
    for point in _plugin_points().values():
        _load_plugin(point, sub)


def _plugin_points() -> dict[str, EntryPoint]:
    """The ``agora.cli`` entry points by name (the first of each name, in a stable order)."""
    points: dict[str, EntryPoint] = {}
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: (p.name, p.value)):
        points.setdefault(point.name, point)
    return points


def _load_plugin(point: EntryPoint, sub: argparse._SubParsersAction[Any]) -> None:
    import_structlog_without_rich()
    try:
        point.load()(sub)
    except Exception as exc:
        print(
            f"agora: warning: leaving out the {point.name!r} subcommands ({point.value}): "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )


#: SDK log events that a command reports itself, in its one line on stderr: a refused handshake
#: (the transport warns at every retry), and a master's ERROR to a scheduler driver and the driver
#: stopping over it (`agora run` reports those when they end it, and notes the rest with -v).
_REPORTED_EVENTS = frozenset(
    {"transport_handshake_failed", "master_error", "scheduler_driver_failed"}
)


def _drop_reported(_logger: Any, _method: str, event: Any) -> Any:
    if event.get("event") in _REPORTED_EVENTS:
        import structlog

        raise structlog.DropEvent
    return event


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agora`` console script; the process's exit status.

    Run as the process itself (no ``argv`` given), a command that sets the parser default
    ``fast_exit`` ends the process as soon as it returns, skipping the interpreter's teardown of
    its modules (40-100 ms on a small machine, longer than the rest of a short ``agora run``)."""
    whole_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser_for(argv).parse_args(argv)
    code = _dispatch(args)
    if whole_process and getattr(args, "fast_exit", False):
        _exit_now(code)
    return code


def _exit_now(code: int) -> None:
    """``os._exit(code)`` once what is buffered is out (sockets and files are closed by then)."""
    import contextlib
    import logging

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: lost either way
            stream.flush()
    logging.shutdown()
    os._exit(code)


def _dispatch(args: argparse.Namespace) -> int:
    import_structlog_without_rich()
    import structlog
    from agora.sdk.cli.common import CliError
    from agora.sdk.logs import configure_logging

    # The SDK's drivers log through structlog: keep that on stderr, and quiet.
    configure_logging("console", "warning")
    structlog.configure(processors=[_drop_reported, *structlog.get_config()["processors"]])
    try:
        code: int = args.func(args)
    except CliError as exc:
        print(f"agora {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f"agora {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `agora tasks | head`
        return 0
    return code
