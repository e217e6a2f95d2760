"""Pure translation between Apache Mesos v1 HTTP API JSON shapes and Agora's message records.

No I/O here: each function takes decoded JSON (dicts, lists, str, numbers) or an Agora record
and returns the other. Input that Agora cannot represent, or that is malformed, raises
:class:`agora.sdk.errors.ProtocolError` with ``field`` naming the offending value.
"""

from __future__ import annotations

from agora.sdk.mesos.frameworks import framework_info_from_mesos, framework_info_to_mesos
from agora.sdk.mesos.ids import id_from_mesos, id_to_mesos
from agora.sdk.mesos.offers import offer_to_mesos
from agora.sdk.mesos.resources import resources_from_mesos, resources_to_mesos
from agora.sdk.mesos.tasks import (
    command_from_mesos,
    executor_info_from_mesos,
    task_info_from_mesos,
    task_status_from_mesos,
    task_status_to_mesos,
)

__all__ = [
    "command_from_mesos",
    "executor_info_from_mesos",
    "framework_info_from_mesos",
    "framework_info_to_mesos",
    "id_from_mesos",
    "id_to_mesos",
    "offer_to_mesos",
    "resources_from_mesos",
    "resources_to_mesos",
    "task_info_from_mesos",
    "task_status_from_mesos",
    "task_status_to_mesos",
]
