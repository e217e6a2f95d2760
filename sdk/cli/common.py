"""What the subcommands share: the --master/--timeout/--curve-* options, errors, operator calls.

CURVE: a master started with ``--curve-secret-key`` admits only clients whose public key it has
(the key file's stem is the client's principal). The commands that talk to the master take
``--curve-secret-key FILE`` (this client's ``NAME.key_secret``) and ``--curve-server-key FILE``
(the master's public ``.key``), by default from ``$AGORA_CURVE_SECRET_KEY`` and
``$AGORA_CURVE_SERVER_KEY``; both or neither. Without either, the keys ``agora local`` wrote for
this user in ``$AGORA_HOME/keys`` (``user-<name>.key_secret`` and ``master.key``), if readable,
unless ``$AGORA_INSECURE`` is set (``1``): then no CURVE, for a master started ``--insecure``.
A refused handshake (unknown key, CURVE expected or not expected, wrong server key) is noticed on
its own link (:func:`handshake_problem`) and reported as one line at once, rather than as a
silent master at the end of ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Final, TypeVar

from agora.sdk.discovery import INSECURE_ENV, master_address, parse_masters
from agora.sdk.operator import OperatorClient, OperatorError
from agora.sdk.transport import CurveClient, ZmqClient, discover_client

__all__ = [
    "CURVE_SECRET_KEY_ENV",
    "CURVE_SERVER_KEY_ENV",
    "DEFAULT_TIMEOUT",
    "CliError",
    "add_master_options",
    "ask_master",
    "call_master",
    "describe_handshake_error",
    "duration",
    "guard_handshake",
    "handshake_problem",
    "positive_float",
    "resolve_curve",
    "resolve_master",
]

T = TypeVar("T")

DEFAULT_TIMEOUT = 5.0
#: The variables the agent daemon reads for the same two files.
CURVE_SECRET_KEY_ENV: Final = "AGORA_CURVE_SECRET_KEY"
CURVE_SERVER_KEY_ENV: Final = "AGORA_CURVE_SERVER_KEY"

#: ZmqClient.handshake_error values (see agora.sdk.transport.zmq_client).
_AUTH_FAILED: Final = "authentication failed"  # the master's ZAP handler refused our key
_PROTOCOL_ERROR: Final = "protocol error"  # one side speaks CURVE, the other does not
#: How often :func:`handshake_problem` looks at its link.
_HANDSHAKE_POLL: Final = 0.02


class CliError(Exception):
    """A failure to report as one line on stderr, exiting with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def duration(seconds: float) -> str:
    """``45s``, ``3m12s``, ``2h05m``, ``3d04h``: a span in its two largest units."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86_400}d{s % 86_400 // 3600:02d}h"


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
    parser.add_argument(
        "--curve-secret-key",
        metavar="FILE",
        help="this client's CURVE secret key (NAME.key_secret, from `agora keys generate`) for "
        f"a master with CURVE on; with --curve-server-key (default: ${CURVE_SECRET_KEY_ENV})",
    )
    parser.add_argument(
        "--curve-server-key",
        metavar="FILE",
        help=f"the master's CURVE public key file (default: ${CURVE_SERVER_KEY_ENV})",
    )


def resolve_master(args: argparse.Namespace) -> str:
    return master_address(args.master)


def resolve_curve(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> CurveClient | None:
    """The CURVE credentials to use: the flags, else the environment (empty = unset), else this
    user's keys in ``$AGORA_HOME/keys`` (written by ``agora local``); None when none of them.
    CliError (code 2) when only one of the two files is given, (code 1) when a file cannot be
    loaded as the key it should be."""
    env = os.environ if environ is None else environ
    secret = _flag_or_env(args.curve_secret_key, env.get(CURVE_SECRET_KEY_ENV))
    server = _flag_or_env(args.curve_server_key, env.get(CURVE_SERVER_KEY_ENV))
    if secret is None and server is None:
        return discover_client(env)
    if secret is None or server is None:
        if server is None:
            given = _source(args.curve_secret_key, "--curve-secret-key", CURVE_SECRET_KEY_ENV)
            missing = f"--curve-server-key (or ${CURVE_SERVER_KEY_ENV})"
        else:
            given = _source(args.curve_server_key, "--curve-server-key", CURVE_SERVER_KEY_ENV)
            missing = f"--curve-secret-key (or ${CURVE_SECRET_KEY_ENV})"
        raise CliError(f"{given} needs {missing}: CURVE takes both keys or neither", code=2)
    secret, server = os.path.expanduser(secret), os.path.expanduser(server)
    for name, path in (
        (_source(args.curve_secret_key, "--curve-secret-key", CURVE_SECRET_KEY_ENV), secret),
        (_source(args.curve_server_key, "--curve-server-key", CURVE_SERVER_KEY_ENV), server),
    ):
        if not os.path.isfile(path):
            raise CliError(f"{name}: no such file {path}")
    try:
        return CurveClient(secret, server)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _source(flag: str | None, flag_name: str, env_name: str) -> str:
    return flag_name if flag is not None and flag.strip() else f"${env_name}"


def _flag_or_env(flag: str | None, env: str | None) -> str | None:
    for value in (flag, env):
        if value is not None and value.strip():
            return value.strip()
    return None


async def handshake_problem(master: str, curve: CurveClient | None) -> str | None:
    """Connect a link of our own to ``master`` with ``curve``; None once its handshake succeeds,
    else (at the first failed handshake) what to tell the user. Runs until one or the other:
    bound it (an unreachable master never answers either way)."""
    # Any one master shows whether our key is admitted (every master admits the same keys).
    client = ZmqClient.connect(parse_masters(master)[0], curve=curve)
    try:
        while not client.connected:
            why = client.handshake_error
            if why is not None:
                return describe_handshake_error(why, master, curve is not None)
            await asyncio.sleep(_HANDSHAKE_POLL)
        return None
    finally:
        client.close()


def describe_handshake_error(why: str, master: str, curve: bool) -> str:
    """One line for a failed handshake with ``master`` (``why``: ZmqClient.handshake_error)."""
    if why == _AUTH_FAILED:
        return (
            f"the master at {master} rejected this client's CURVE key ({why}): its public key "
            "is not among the master's authorized keys"
        )
    if not curve:
        # A plain link fails its handshake only with a peer that wants a security mechanism.
        # (The mismatch shows as "protocol error", or as "handshake failed" when the master hung
        # up first.)
        return (
            f"the master at {master} requires CURVE ({why}) and this user has no keys for it: "
            "give --curve-secret-key and --curve-server-key (or set "
            f"${CURVE_SECRET_KEY_ENV} and ${CURVE_SERVER_KEY_ENV}); agora local admits only the "
            "user who started it, through its $AGORA_HOME/keys"
        )
    if why == _PROTOCOL_ERROR:
        return (
            f"the master at {master} does not use CURVE ({why}): "
            "leave out --curve-secret-key and --curve-server-key, or set "
            f"${INSECURE_ENV}=1 to skip the keys in $AGORA_HOME/keys"
        )
    # A master that cannot read our HELLO (another server key) hangs up without a word; so may
    # a master without CURVE.
    return (
        f"the CURVE handshake with the master at {master} failed ({why}): "
        "is --curve-server-key the master's public key, and does the master use CURVE? "
        f"(for a master started --insecure, set ${INSECURE_ENV}=1 to skip the keys in "
        "$AGORA_HOME/keys)"
    )


async def guard_handshake(master: str, curve: CurveClient | None, work: Awaitable[T]) -> T:
    """``work``'s result, unless a handshake with ``master`` fails first: then CliError (and
    ``work`` is cancelled). Once a handshake has succeeded, simply ``work``."""
    job = asyncio.ensure_future(work)
    probe = asyncio.ensure_future(handshake_problem(master, curve))
    try:
        await asyncio.wait({job, probe}, return_when=asyncio.FIRST_COMPLETED)
        if not job.done():
            problem = probe.result()
            if problem is not None:
                raise CliError(problem)
        return await job
    finally:
        for fut in (job, probe):
            if not fut.done():
                fut.cancel()
        await asyncio.gather(job, probe, return_exceptions=True)


def call_master(
    master: str,
    timeout: float,
    call: Callable[[OperatorClient], Awaitable[T]],
    curve: CurveClient | None = None,
) -> T:
    """Run ``call`` with an operator client for ``master``; any failure becomes a CliError.

    The whole exchange is bounded by ``timeout`` (plus a little slack for closing), so an
    unreachable master costs at most that long; a refused handshake ends it at once.
    """
    return asyncio.run(ask_master(master, timeout, call, curve))


async def ask_master(
    master: str,
    timeout: float,
    call: Callable[[OperatorClient], Awaitable[T]],
    curve: CurveClient | None = None,
) -> T:
    """:func:`call_master` for code already on an event loop."""
    client = OperatorClient(master, curve=curve)
    try:
        async with asyncio.timeout(timeout + 0.5):
            return await guard_handshake(master, curve, call(client))
    except CliError:
        raise
    except TimeoutError as exc:
        detail = str(exc) or f"no answer from the master at {master} in {timeout:g}s"
        raise CliError(f"cannot reach the master: {detail}") from None
    except OperatorError as exc:
        raise CliError(f"the master refused: {exc} ({exc.code.name})") from None
    except Exception as exc:  # a bad endpoint, a socket error: one line, not a traceback
        raise CliError(f"{master}: {str(exc).strip() or type(exc).__name__}") from None
