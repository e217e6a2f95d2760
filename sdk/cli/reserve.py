"""``agora reserve AGENT_ID ROLE RESOURCES`` and ``agora unreserve AGENT_ID ROLE RESOURCES``:
reserve free resources of an agent to a role, or give back what was reserved that way
(operator calls). The agent keeps the reservations across its restarts and master failovers.
"""

from __future__ import annotations

import argparse

from agora.sdk.cli.common import CliError, add_master_options
from agora.sdk.cli.operate import _an_id, _call, role_name
from agora.sdk.ids import AgentID
from agora.sdk.resources import UNRESERVED, ResourceError, Resources

__all__ = ["add_parsers", "cmd_reserve", "plain_resources"]


def plain_resources(text: str) -> Resources:
    """argparse type: non-empty resources without roles (``cpus:2;mem:1024``)."""
    try:
        res = Resources.parse(text)
    except ResourceError as exc:
        raise argparse.ArgumentTypeError(f"bad resources {text!r}: {exc}") from None
    if res.is_empty():
        raise argparse.ArgumentTypeError(f"expected resources such as 'cpus:2', got {text!r}")
    if res.roles() != {UNRESERVED}:
        raise argparse.ArgumentTypeError(
            f"give the resources without a role ({text!r}): ROLE says which role"
        )
    return res


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, help_, description in (
        (
            "reserve",
            "reserve free resources of an agent to a role (operator call)",
            "Reserve RESOURCES (cpus:2;mem:1024) of the agent to ROLE: they are offered only to "
            "frameworks of ROLE from then on, also after the agent restarts or the master fails "
            "over. They must be free (outstanding offers there are rescinded).",
        ),
        (
            "unreserve",
            "give back resources reserved to a role (operator call)",
            "Give back RESOURCES reserved to ROLE on the agent by `agora reserve` or a "
            "framework's RESERVE (never the agent's own --resources reservations).",
        ),
    ):
        cmd = sub.add_parser(name, help=help_, description=description)
        cmd.add_argument("agent_id", metavar="AGENT_ID", help="as `agora agents` shows it")
        cmd.add_argument("role", type=role_name, metavar="ROLE")
        cmd.add_argument("resources", type=plain_resources, metavar="RESOURCES")
        add_master_options(cmd)
        cmd.set_defaults(func=cmd_reserve, reserve=name == "reserve")


def cmd_reserve(args: argparse.Namespace) -> int:
    agent_id = AgentID(_an_id(args.agent_id, "AGENT_ID"))
    role: str = args.role
    if role == UNRESERVED:
        raise CliError("ROLE cannot be '*': name the role to reserve for", code=2)
    resources: Resources = args.resources.flatten(role)
    timeout: float = args.timeout
    if args.reserve:
        return _call(args, lambda c: c.reserve_resources(agent_id, resources, timeout=timeout))
    return _call(args, lambda c: c.unreserve_resources(agent_id, resources, timeout=timeout))
