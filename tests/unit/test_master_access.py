"""The master's access check, alone: a message and who sent it in, the message to hand the core
or why it is forbidden out."""

from __future__ import annotations

from agora.master.server.access import authorize
from agora.sdk.messages import AgentInfo, FrameworkInfo, GetState, RegisterAgent, Subscribe
from agora.sdk.messages.operator import DrainAgent
from agora.sdk.resources import Resources
from agora.sdk.transport import Acl

ACL = Acl.from_dict(
    {"agents": ["agent"], "operators": ["ops"], "roles": {"fw": ["batch"], "*": []}}
)


def _subscribe(principal: str | None = None, roles: tuple[str, ...] = ("batch",)) -> Subscribe:
    return Subscribe(framework_info=FrameworkInfo(name="f", roles=roles, principal=principal))


def test_curve_fills_in_the_principal_and_refuses_another_ones() -> None:
    passed = authorize(_subscribe(), "fw", acl=ACL, authenticated=True)
    assert isinstance(passed, Subscribe) and passed.framework_info.principal == "fw"
    assert authorize(_subscribe("ops"), "fw", acl=ACL, authenticated=True) == (
        "framework principal 'ops' is not the connection's"
    )
    assert authorize(_subscribe(), None, acl=ACL, authenticated=True) == (
        "unauthenticated connection"
    )


def test_the_acl_decides_roles_agents_and_operator_calls() -> None:
    assert authorize(_subscribe(roles=("prod",)), "fw", acl=ACL, authenticated=True) == (
        "role 'prod' is not allowed"
    )
    register = RegisterAgent(
        agent_info=AgentInfo(hostname="h", resources=Resources.parse("cpus:1"))
    )
    assert authorize(register, "agent", acl=ACL, authenticated=True) is register
    assert authorize(register, "fw", acl=ACL, authenticated=True) == "may not register agents"
    drain = DrainAgent(agent_id="a1")  # type: ignore[arg-type]
    assert authorize(drain, "ops", acl=ACL, authenticated=True) is drain
    assert authorize(drain, "fw", acl=ACL, authenticated=True) == "may not make operator calls"
    state = GetState()
    assert authorize(state, "fw", acl=None, authenticated=False) is state  # no ACL: no checks
