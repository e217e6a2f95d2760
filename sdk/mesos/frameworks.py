"""Mesos ``FrameworkInfo`` JSON <-> Agora :class:`~agora.sdk.messages.common.FrameworkInfo`.

Translated: ``user``, ``name``, ``id``, ``role`` / ``roles``, ``failover_timeout``,
``checkpoint``, ``hostname``, ``principal`` and ``capabilities`` that Agora has (PARTITION_AWARE,
TASK_KILLING_STATE, MULTI_ROLE, REVOCABLE_RESOURCES; GPU_RESOURCES is accepted and has no
effect); ``webui_url`` is accepted and not kept. Other capabilities and fields (labels,
offer_filters, domain) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

from agora.sdk.ids import FrameworkID
from agora.sdk.mesos._json import (
    array,
    boolean,
    fail,
    number,
    obj,
    required,
    string,
)
from agora.sdk.mesos.ids import id_from_mesos, id_to_mesos
from agora.sdk.messages._record import DAY
from agora.sdk.messages.common import FrameworkInfo
from agora.sdk.messages.enums import FrameworkCapability

__all__ = ["framework_info_from_mesos", "framework_info_to_mesos"]

_KEYS = (
    "user",
    "name",
    "id",
    "failover_timeout",
    "checkpoint",
    "role",
    "roles",
    "hostname",
    "principal",
    "capabilities",
    "webui_url",
)
_MESOS_CAPS = {
    c.value
    for c in (
        FrameworkCapability.PARTITION_AWARE,
        FrameworkCapability.TASK_KILLING_STATE,
        FrameworkCapability.MULTI_ROLE,
        FrameworkCapability.REVOCABLE_RESOURCES,
    )
}

#: Capabilities accepted and dropped: Agora offers every agent's resources alike, GPUs included
#: (pymesos asks for GPU_RESOURCES whenever the master is 1.0 or later).
_ACCEPTED_CAPS = frozenset({"GPU_RESOURCES"})


def framework_info_from_mesos(value: object, field: str = "framework_info") -> FrameworkInfo:
    """A Mesos FrameworkInfo as Agora's subscribe record (``name`` and ``user`` required)."""
    o = obj(value, field, _KEYS)
    if "webui_url" in o:
        string(o["webui_url"], f"{field}.webui_url", max_len=4096)
    name = string(required(o, "name", field), f"{field}.name", max_len=255)
    user = string(required(o, "user", field), f"{field}.user", max_len=255)
    caps = _capabilities(o.get("capabilities", []), f"{field}.capabilities")
    multi = FrameworkCapability.MULTI_ROLE in caps
    if multi:
        if "role" in o:
            fail(f"{field}.role", "must not be set with the MULTI_ROLE capability (use roles)")
        roles_raw = array(o.get("roles", []), f"{field}.roles")
        roles = tuple(
            string(r, f"{field}.roles[{i}]", max_len=255, empty=False)
            for i, r in enumerate(roles_raw)
        )
        if len(set(roles)) != len(roles):
            fail(f"{field}.roles", "repeats a role")
        if not roles:
            fail(f"{field}.roles", "must name at least one role")
    else:
        if "roles" in o:
            fail(f"{field}.roles", "needs the MULTI_ROLE capability")
        roles = (string(o.get("role", "*"), f"{field}.role", max_len=255, empty=False),)
    principal = None
    if o.get("principal") is not None:
        principal = string(o["principal"], f"{field}.principal", max_len=255)
    return FrameworkInfo(
        name=name,
        user=user,
        roles=roles,
        failover_timeout=number(
            o.get("failover_timeout", 0.0), f"{field}.failover_timeout", hi=365 * DAY
        ),
        capabilities=caps,
        principal=principal,
        hostname=string(o.get("hostname", ""), f"{field}.hostname", max_len=255),
        framework_id=(
            id_from_mesos(o["id"], FrameworkID, f"{field}.id") if o.get("id") is not None else None
        ),
        checkpoint=boolean(o.get("checkpoint", False), f"{field}.checkpoint"),
    )


def framework_info_to_mesos(info: FrameworkInfo) -> dict[str, object]:
    """Agora's FrameworkInfo as Mesos JSON; refuses the GANG capability (no Mesos equivalent)."""
    out: dict[str, object] = {"user": info.user, "name": info.name}
    if info.framework_id is not None:
        out["id"] = id_to_mesos(info.framework_id)
    out["failover_timeout"] = info.failover_timeout
    out["checkpoint"] = info.checkpoint
    caps = []
    for c in info.capabilities:
        if c.value not in _MESOS_CAPS:
            fail("framework_info.capabilities", f"{c.value} has no Mesos equivalent")
        caps.append({"type": c.value})
    if FrameworkCapability.MULTI_ROLE in info.capabilities:
        out["roles"] = list(info.roles)
    elif len(info.roles) == 1:
        out["role"] = info.roles[0]
    else:
        fail("framework_info.roles", "several roles need the MULTI_ROLE capability")
    if info.hostname:
        out["hostname"] = info.hostname
    if info.principal is not None:
        out["principal"] = info.principal
    out["capabilities"] = caps
    return out


def _capabilities(value: object, f: str) -> tuple[FrameworkCapability, ...]:
    out: list[FrameworkCapability] = []
    for i, c in enumerate(array(value, f, max_items=64)):
        cf = f"{f}[{i}]"
        co: Mapping[str, object] = obj(c, cf, ("type",))
        t = string(required(co, "type", cf), f"{cf}.type", max_len=64)
        if t in _ACCEPTED_CAPS:
            continue
        if t not in _MESOS_CAPS:
            fail(f"{cf}.type", f"capability {t!r} is not supported by Agora")
        cap = FrameworkCapability(t)
        if cap not in out:
            out.append(cap)
    return tuple(out)
