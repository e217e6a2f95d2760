"""Who may send what to the master: the check the daemon makes on every client message before
the core sees it. Pure: a message and who sent it in, the message to hand on (or why not) out."""

from __future__ import annotations

from agora.sdk.messages import (
    OPERATOR_CALLS,
    Message,
    RegisterAgent,
    ReregisterAgent,
    Subscribe,
)
from agora.sdk.transport import Acl
from msgspec.structs import replace

__all__ = ["authorize"]


def authorize(
    message: Message, principal: str | None, *, acl: Acl | None, authenticated: bool
) -> Message | str:
    """The message to hand the core, or why it is forbidden.

    With CURVE (``authenticated``), a SUBSCRIBE's ``framework_info.principal`` must be the
    connection's principal (it is filled in when left empty). The ACL (if any) is checked against
    the principal, which is None when CURVE is off (then only ``"*"`` entries match).
    """
    if authenticated and principal is None:  # the ZAP handler admitted no such peer
        return "unauthenticated connection"
    if isinstance(message, Subscribe):
        info = message.framework_info
        if authenticated and info.principal is not None and info.principal != principal:
            return f"framework principal {info.principal!r} is not the connection's"
        if acl is not None:
            denied = acl.may_use_roles(principal, info.roles)
            if denied is not None:
                return f"role {denied!r} is not allowed"
        if authenticated and info.principal is None:
            return replace(message, framework_info=replace(info, principal=principal))
        return message
    if acl is None:
        return message
    if isinstance(message, RegisterAgent | ReregisterAgent):
        if not acl.may_register_agent(principal):
            return "may not register agents"
    elif isinstance(message, OPERATOR_CALLS) and not acl.may_operate(principal):
        return "may not make operator calls"
    return message
