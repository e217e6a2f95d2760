"""Operator calls that change the cluster: ``agora weights``, ``agora quota``, ``agora drain``,
``agora reactivate``, ``agora gone`` and ``agora teardown``.

Each makes one call to the master and prints the master's answer once the change took effect
(committed to the registry, so a new leader keeps it); a refusal is one line on stderr and exit 1.
Arguments are checked here first: a malformed one is a usage error (exit 2) that never reaches the
master. The two calls that cannot be undone (``gone``, ``teardown``) want ``--yes``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Awaitable, Callable, Sequence

from agora.sdk._resources_base import valid_role
from agora.sdk.cli.common import (
    CliError,
    add_master_options,
    call_master,
    resolve_curve,
    resolve_master,
)
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import OperatorDone
from agora.sdk.operator import OperatorClient
from agora.sdk.resources import ResourceError, Resources

__all__ = [
    "MAX_WEIGHT",
    "MIN_WEIGHT",
    "add_parsers",
    "cmd_agent_call",
    "cmd_quota",
    "cmd_teardown",
    "cmd_weights",
    "parse_weights",
    "role_name",
    "role_weight",
    "scalar_resources",
]

#: The weights the master takes (the wire's bounds).
MIN_WEIGHT = 0.0001
MAX_WEIGHT = 1_000_000.0

_Call = Callable[[OperatorClient], Awaitable[OperatorDone]]


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    weights = sub.add_parser(
        "weights",
        help="set the DRF weight of roles (operator call)",
        description="Set the DRF weight of each role named; the other roles keep theirs. A role "
        "of weight 2 is entitled to twice the share of a role of weight 1.",
    )
    weights.add_argument(
        "pairs", nargs="+", type=role_weight, metavar="ROLE=WEIGHT", help="e.g. batch=3"
    )
    add_master_options(weights)
    weights.set_defaults(func=cmd_weights)

    quota = sub.add_parser(
        "quota",
        help="set or remove a role's quota (operator call)",
        description="Set ROLE's quota: a guarantee of scalar resources the allocator keeps for it "
        "and, with --limit, a ceiling on what it may hold. --remove takes the quota away.",
    )
    quota.add_argument("role", type=role_name, metavar="ROLE")
    how = quota.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--guarantee", type=scalar_resources, metavar="RES", help="e.g. 'cpus:4;mem:8192'"
    )
    how.add_argument("--remove", action="store_true", help="remove the role's quota")
    quota.add_argument(
        "--limit", type=scalar_resources, metavar="RES", help="the most the role may hold"
    )
    add_master_options(quota)
    quota.set_defaults(func=cmd_quota)

    for name, help_, description in (
        (
            "drain",
            "stop offering an agent's resources (operator call)",
            "The agent gets no new offers (its outstanding ones are rescinded); what runs there "
            "runs on until it ends. `agora reactivate` undoes it.",
        ),
        (
            "reactivate",
            "offer a drained agent's resources again (operator call)",
            "Undo `agora drain`: the agent's resources are offered again.",
        ),
        (
            "gone",
            "remove an agent for good (operator call; irreversible, needs --yes)",
            "Mark the agent gone: it is told to shut down, its tasks end GONE_BY_OPERATOR, and it "
            "may never come back under its id. This cannot be undone, so it needs --yes.",
        ),
    ):
        agent = sub.add_parser(name, help=help_, description=description)
        agent.add_argument("agent_id", metavar="AGENT_ID", help="as `agora agents` shows it")
        if name == "gone":
            _add_yes(agent, "the agent is gone for good")
        if name == "drain":
            agent.add_argument(
                "--deadline",
                metavar="D",
                help="kill what still runs there after D (30m, 2h) or at a time (+30m, "
                "2026-12-05T14:00); reason AGENT_DRAINING",
            )
        add_master_options(agent)
        agent.set_defaults(func=cmd_agent_call, agent_call=name)

    teardown = sub.add_parser(
        "teardown",
        help="remove a framework and kill its tasks (operator call; needs --yes)",
        description="Tear the framework down: its offers are rescinded, its tasks killed, and it "
        "may not subscribe again under its id. This cannot be undone, so it needs --yes.",
    )
    teardown.add_argument("framework_id", metavar="FRAMEWORK_ID", help="as `agora state` shows it")
    _add_yes(teardown, "the framework's tasks are killed")
    add_master_options(teardown)
    teardown.set_defaults(func=cmd_teardown)


def _add_yes(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--yes", action="store_true", help=f"do it ({what}; no undo)")


# ---------------------------------------------------------------- argument types


def role_name(text: str) -> str:
    """argparse type: a role name the master could know."""
    role = text.strip()
    if not role or not valid_role(role):
        raise argparse.ArgumentTypeError(f"invalid role name {text!r}")
    return role


def role_weight(text: str) -> tuple[str, float]:
    """argparse type: ``ROLE=WEIGHT`` with a finite weight the master takes."""
    role, sep, number = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected ROLE=WEIGHT, got {text!r}")
    try:
        name = role_name(role)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} in {text!r}") from None
    try:
        weight = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number after '=' in {text!r}, got {number!r}"
        ) from None
    if not math.isfinite(weight) or not MIN_WEIGHT <= weight <= MAX_WEIGHT:
        raise argparse.ArgumentTypeError(
            f"the weight in {text!r} must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}"
        )
    return name, weight


def parse_weights(pairs: Sequence[tuple[str, float]]) -> dict[str, float]:
    """The pairs as a mapping; CliError (usage, exit 2) when a role is named twice."""
    out: dict[str, float] = {}
    for role, weight in pairs:
        if role in out:
            raise CliError(f"role {role!r} is given twice", code=2)
        out[role] = weight
    return out


def scalar_resources(text: str) -> Resources:
    """argparse type: non-empty scalar resources (``cpus:4;mem:8192``), as quota takes."""
    try:
        res = Resources.parse(text)
    except ResourceError as exc:
        raise argparse.ArgumentTypeError(f"bad resources {text!r}: {exc}") from None
    if res.is_empty():
        raise argparse.ArgumentTypeError(
            f"expected resources such as 'cpus:4;mem:8192', got {text!r}"
        )
    if res.names() != frozenset(res.scalar_totals_milli()):
        raise argparse.ArgumentTypeError(f"quota takes scalar resources only, got {text!r}")
    return res


# ---------------------------------------------------------------- commands


def cmd_weights(args: argparse.Namespace) -> int:
    weights = parse_weights(args.pairs)
    timeout: float = args.timeout
    return _call(args, lambda c: c.update_weights(weights, timeout=timeout))


def cmd_quota(args: argparse.Namespace) -> int:
    timeout: float = args.timeout
    role: str = args.role
    if args.remove:
        if args.limit is not None:
            raise CliError("--limit goes with --guarantee, not with --remove", code=2)
        return _call(args, lambda c: c.remove_quota(role, timeout=timeout))
    guarantee: Resources = args.guarantee
    limit: Resources | None = args.limit
    return _call(args, lambda c: c.update_quota(role, guarantee, limit, timeout=timeout))


def cmd_agent_call(args: argparse.Namespace) -> int:
    """``drain``, ``reactivate`` and ``gone``: one call about one agent."""
    agent_id = AgentID(_an_id(args.agent_id, "AGENT_ID"))
    timeout: float = args.timeout
    if args.agent_call == "gone":
        _need_yes(
            args,
            f"marking agent {agent_id} gone cannot be undone: it is shut down, its "
            "tasks end, and it may never rejoin under this id",
        )
        return _call(args, lambda c: c.mark_agent_gone(agent_id, timeout=timeout))
    if args.agent_call == "drain":
        deadline = _deadline(args.deadline)
        return _call(args, lambda c: c.drain_agent(agent_id, timeout=timeout, deadline=deadline))
    return _call(args, lambda c: c.reactivate_agent(agent_id, timeout=timeout))


def _deadline(text: str | None) -> float | None:
    """A drain's deadline: a duration from now (``30m``) or a time (``+30m``, ISO, epoch)."""
    if text is None:
        return None
    from agora.sdk.cli.maintenance import duration, moment

    try:
        return time.time() + duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        return moment(text)
    except argparse.ArgumentTypeError as exc:
        raise CliError(f"--deadline: {exc}", code=2) from None


def cmd_teardown(args: argparse.Namespace) -> int:
    framework_id = FrameworkID(_an_id(args.framework_id, "FRAMEWORK_ID"))
    timeout: float = args.timeout
    _need_yes(
        args,
        f"tearing framework {framework_id} down cannot be undone: its tasks are "
        "killed and it may not subscribe again under this id",
    )
    return _call(args, lambda c: c.teardown_framework(framework_id, timeout=timeout))


def _an_id(text: str, what: str) -> str:
    value = text.strip()
    if not value:
        raise CliError(f"{what} is empty", code=2)
    return value


def _need_yes(args: argparse.Namespace, why: str) -> None:
    if not args.yes:
        raise CliError(f"{why}; add --yes to go ahead", code=2)


def _call(args: argparse.Namespace, call: _Call) -> int:
    done = call_master(resolve_master(args), args.timeout, call, resolve_curve(args))
    print(done.message or f"{done.call} done")
    return 0
