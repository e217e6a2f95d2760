"""``agora``: argument parsing and dispatch to the subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

import structlog
from agora.sdk.cli import image, keys, kill, local, logs, operate, run, show, top
from agora.sdk.cli.common import CliError
from agora.sdk.logs import configure_logging

__all__ = ["build_parser", "main"]

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
  agora weights batch=3 analytics=1      # DRF weights per role
  agora quota batch --guarantee 'cpus:4;mem:8192' --limit cpus:8   # --remove takes it away
  agora teardown FRAMEWORK_ID --yes      # kill a framework's tasks and remove it
  agora logs --follow agora-run-1a2b3c4d # a task's stdout, through its agent (--stderr)

With CURVE on at the master, the commands that talk to it take --curve-secret-key FILE (this
client's NAME.key_secret) and --curve-server-key FILE (the master's public key), else
$AGORA_CURVE_SECRET_KEY and $AGORA_CURVE_SERVER_KEY; `agora keys generate NAME` makes keys.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agora",
        description="Agora: a resource-offer cluster manager in the model of Apache Mesos.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    local.add_parser(sub)
    run.add_parser(sub)
    show.add_parsers(sub)
    kill.add_parser(sub)
    operate.add_parsers(sub)
    logs.add_parser(sub)
    top.add_parser(sub)
    keys.add_parser(sub)
    image.add_parser(sub)
    _add_plugins(sub)
    return parser


#: The entry-point group of subcommands that other packages add to ``agora`` (each entry point is
#: a function called with the subparsers, like the ``add_parser`` of the built-in ones).
PLUGIN_GROUP = "agora.cli"


def _add_plugins(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subcommands of every ``agora.cli`` entry point, by name; one that fails to load is
    left out with a warning, never breaking ``agora``."""
    seen: set[str] = set()
    for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: (p.name, p.value)):
        if point.name in seen:
            continue
        seen.add(point.name)
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
        raise structlog.DropEvent
    return event


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agora`` console script; the process's exit status."""
    args = build_parser().parse_args(argv)
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
