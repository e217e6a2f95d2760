"""Task output streamed as framework messages: the payload format and its label.

A command task whose ``TaskInfo.labels[OUTPUT_LABEL] == "1"`` has every chunk its process writes to
stdout or stderr sent to its framework as a framework message (EXECUTOR_TO_FRAMEWORK), all of them
before the task's terminal status update. Each message's data is the msgpack map
``{"task_id": str, "stream": "stdout" | "stderr", "data": bytes}`` with at most
:data:`MAX_OUTPUT_CHUNK` bytes of data. :func:`decode_output` turns one back into its parts.
"""

from __future__ import annotations

from typing import Final

import msgpack
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import TaskID

__all__ = ["MAX_OUTPUT_CHUNK", "OUTPUT_LABEL", "OUTPUT_STREAMS", "decode_output", "encode_output"]

OUTPUT_LABEL: Final = "agora.stream_output"
MAX_OUTPUT_CHUNK: Final = 64 * 1024
OUTPUT_STREAMS: Final = ("stdout", "stderr")
_KEYS: Final = frozenset({"task_id", "stream", "data"})
_MAX_PAYLOAD: Final = MAX_OUTPUT_CHUNK + 1024


def encode_output(task_id: str, stream: str, data: bytes) -> bytes:
    """The framework-message payload of one output chunk (``len(data) <= MAX_OUTPUT_CHUNK``)."""
    if stream not in OUTPUT_STREAMS:
        raise ValueError(f"stream must be one of {OUTPUT_STREAMS}, got {stream!r}")
    if len(data) > MAX_OUTPUT_CHUNK:
        raise ValueError(f"an output chunk holds at most {MAX_OUTPUT_CHUNK} bytes, got {len(data)}")
    payload: bytes = msgpack.packb(
        {"task_id": str(task_id), "stream": stream, "data": bytes(data)}, use_bin_type=True
    )
    return payload


def decode_output(data: bytes) -> tuple[TaskID, str, bytes]:
    """``(task_id, stream, chunk)`` of a payload from :func:`encode_output`.

    Raises :class:`~agora.sdk.errors.ProtocolError` when ``data`` is not such a payload (e.g. a
    framework message of another kind).
    """
    if len(data) > _MAX_PAYLOAD:
        raise ProtocolError(f"output payload too large: {len(data)} bytes")
    try:
        value = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_str_len=1024,
            max_bin_len=MAX_OUTPUT_CHUNK,
            max_array_len=0,
            max_map_len=len(_KEYS),
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(f"not an output payload: {exc}") from None
    if not isinstance(value, dict) or value.keys() != _KEYS:
        raise ProtocolError("not an output payload: expected a map of task_id, stream and data")
    task_id, stream, chunk = value["task_id"], value["stream"], value["data"]
    if not isinstance(task_id, str) or not task_id:
        raise ProtocolError("output payload: task_id must be a non-empty str")
    if stream not in OUTPUT_STREAMS:
        raise ProtocolError(f"output payload: stream must be one of {OUTPUT_STREAMS}")
    if not isinstance(chunk, bytes):
        raise ProtocolError("output payload: data must be bytes")
    return TaskID(task_id), stream, chunk
