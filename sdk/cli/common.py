"""What the subcommands share: the --master/--timeout options, errors, and operator calls."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from agora.sdk.discovery import master_address
from agora.sdk.operator import OperatorClient, OperatorError

__all__ = [
    "DEFAULT_TIMEOUT",
    "CliError",
    "add_master_options",
    "ask_master",
    "call_master",
    "positive_float",
    "resolve_master",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0


class CliError(Exception):
    """A failure to report as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def add_master_options(
    parser: argparse.ArgumentParser,
    timeout: float = DEFAULT_TIMEOUT,
    what: str = "give up on the master after S seconds",
) -> None:
    parser.add_argument(
        "--master",
        metavar="ADDR",
        help="master endpoint (default: $AGORA_MASTER, else $AGORA_HOME/master written by "
        "`agora local`, else tcp://127.0.0.1:5050)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=timeout,
        metavar="S",
        help=f"{what} (default {timeout:g})",
    )


def resolve_master(args: argparse.Namespace) -> str:
    return master_address(args.master)


def call_master(master: str, timeout: float, call: Callable[[OperatorClient], Awaitable[T]]) -> T:
    """Run ``call`` with an operator client for ``master``; any failure becomes a CliError.

    The whole exchange is bounded by ``timeout`` (plus a little slack for closing), so an
    unreachable master costs at most that long.
    """
    return asyncio.run(ask_master(master, timeout, call))


async def ask_master(
    master: str, timeout: float, call: Callable[[OperatorClient], Awaitable[T]]
) -> T:
    """:func:`call_master` for code already on an event loop."""
    client = OperatorClient(master)
    try:
        async with asyncio.timeout(timeout + 0.5):
            return await call(client)
    except TimeoutError as exc:
        detail = str(exc) or f"no answer from the master at {master} in {timeout:g}s"
        raise CliError(f"cannot reach the master: {detail}") from None
    except OperatorError as exc:
        raise CliError(f"the master refused: {exc} ({exc.code.name})") from None
    except Exception as exc:  # a bad endpoint, a socket error: one line, not a traceback
        raise CliError(f"{master}: {str(exc).strip() or type(exc).__name__}") from None
