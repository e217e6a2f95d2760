"""Task output streamed as framework messages: the payload format and its label.

A command task whose ``TaskInfo.labels[OUTPUT_LABEL] == "1"`` has every chunk its process writes to
stdout or stderr sent to its framework as a framework message (EXECUTOR_TO_FRAMEWORK), all of them
before the task's terminal status update. Each message's data is the msgpack map
``{"task_id": str, "stream": "stdout" | "stderr", "data": bytes, "offset": int}`` with at most
:data:`MAX_OUTPUT_CHUNK` bytes of data; ``offset`` (optional: older agents leave it out) is where
the chunk starts in the stream, so a reader can tell a chunk lost on the way (framework messages
are best effort: one sent while the leading master fails over is gone) and read the gap from the
task's sandbox. :func:`decode_output` turns a payload back into its parts, :func:`decode_output_at`
with the offset; keys a newer agent may add are ignored.
"""

from __future__ import annotations

from typing import Final

import msgpack
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import TaskID

__all__ = [
    "MAX_OUTPUT_CHUNK",
    "OUTPUT_LABEL",
    "OUTPUT_STREAMS",
    "decode_output",
    "decode_output_at",
    "encode_output",
]

OUTPUT_LABEL: Final = "agora.stream_output"
MAX_OUTPUT_CHUNK: Final = 64 * 1024
OUTPUT_STREAMS: Final = ("stdout", "stderr")
_KEYS: Final = frozenset({"task_id", "stream", "data"})
#: Keys beyond these three that a payload may carry (known or from a newer agent).
_MAX_KEYS: Final = 8
_MAX_PAYLOAD: Final = MAX_OUTPUT_CHUNK + 1024


def encode_output(task_id: str, stream: str, data: bytes, offset: int | None = None) -> bytes:
    """The framework-message payload of one output chunk (``len(data) <= MAX_OUTPUT_CHUNK``)
    that starts ``offset`` bytes into its stream."""
    if stream not in OUTPUT_STREAMS:
        raise ValueError(f"stream must be one of {OUTPUT_STREAMS}, got {stream!r}")
    if len(data) > MAX_OUTPUT_CHUNK:
        raise ValueError(f"an output chunk holds at most {MAX_OUTPUT_CHUNK} bytes, got {len(data)}")
    value: dict[str, object] = {"task_id": str(task_id), "stream": stream, "data": bytes(data)}
    if offset is not None:
        if offset < 0:
            raise ValueError(f"an output offset is >= 0, got {offset}")
        value["offset"] = offset
    payload: bytes = msgpack.packb(value, use_bin_type=True)
    return payload


def decode_output(data: bytes) -> tuple[TaskID, str, bytes]:
    """``(task_id, stream, chunk)`` of a payload from :func:`encode_output`.

    Raises :class:`~agora.sdk.errors.ProtocolError` when ``data`` is not such a payload (e.g. a
    framework message of another kind).
    """
    task_id, stream, chunk, _offset = decode_output_at(data)
    return task_id, stream, chunk


def decode_output_at(data: bytes) -> tuple[TaskID, str, bytes, int | None]:
    """``(task_id, stream, chunk, offset)``: as :func:`decode_output`, with the chunk's offset in
    its stream (None from an agent that does not send it)."""
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
            max_map_len=_MAX_KEYS,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise ProtocolError(f"not an output payload: {exc}") from None
    if not isinstance(value, dict) or not value.keys() >= _KEYS:
        raise ProtocolError("not an output payload: expected a map of task_id, stream and data")
    offset = value.get("offset")
    if offset is not None and (type(offset) is not int or offset < 0):
        raise ProtocolError("output payload: offset must be an int >= 0")
    task_id, stream, chunk = value["task_id"], value["stream"], value["data"]
    if not isinstance(task_id, str) or not task_id:
        raise ProtocolError("output payload: task_id must be a non-empty str")
    if stream not in OUTPUT_STREAMS:
        raise ProtocolError(f"output payload: stream must be one of {OUTPUT_STREAMS}")
    if not isinstance(chunk, bytes):
        raise ProtocolError("output payload: data must be bytes")
    return TaskID(task_id), stream, chunk, offset
