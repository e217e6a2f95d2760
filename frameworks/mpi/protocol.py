"""The messages between ``agora mpirun`` (the scheduler), the members' executors and the launcher.

Scheduler <-> executors ride on Agora's framework messages (scheduler -> master -> agent ->
executor and back); the launcher talks to its own (rank-0) executor over a unix socket. Every
message is a msgpack map with a ``t`` (type) key; :func:`decode` refuses anything else with a
:class:`ProtocolError`, so a stray or hostile frame is dropped, never acted on.

Types, by direction:

- launcher -> rank-0 executor: ``run {host, cmd}`` (one per connection).
- rank-0 executor -> scheduler: ``launch {id, host, cmd}`` (a launcher's request);
  ``cancel {id}`` (that launcher went away); ``log {fd, data}`` (mpirun's own output).
- scheduler -> member executor: ``exec {id, cmd}``; ``kill {id}``.
- member executor -> scheduler: ``out {id, fd, data}``; ``exit {id, code}``.
- scheduler -> rank-0 executor, and rank-0 executor -> launcher: ``out {id, fd, data}``,
  ``exit {id, code}`` (code 255: the member cannot be reached).
"""

from __future__ import annotations

import struct
from typing import Any, Final

import msgpack

__all__ = [
    "MAX_FRAME",
    "UNREACHABLE",
    "ProtocolError",
    "decode",
    "encode",
    "frame",
    "read_frames",
]

#: ssh's exit status when the remote side cannot be reached.
UNREACHABLE: Final = 255
MAX_FRAME: Final = 1 << 20

_FIELDS: Final[dict[str, dict[str, type | tuple[type, ...]]]] = {
    "run": {"host": str, "cmd": str},
    "launch": {"id": str, "host": str, "cmd": str},
    "cancel": {"id": str},
    "log": {"fd": int, "data": bytes},
    "exec": {"id": str, "cmd": str},
    "kill": {"id": str},
    "out": {"id": str, "fd": int, "data": bytes},
    "exit": {"id": str, "code": int},
}


class ProtocolError(ValueError):
    """A message that is not one of ours."""


def encode(kind: str, **fields: Any) -> bytes:
    if kind not in _FIELDS:
        raise ProtocolError(f"unknown message type {kind!r}")
    return msgpack.packb({"t": kind, **fields}, use_bin_type=True)  # type: ignore[no-any-return]


def decode(data: bytes) -> dict[str, Any]:
    """The message in ``data``: a dict with ``t`` and exactly its type's fields, each of its
    type (``data`` fields are bytes, ``fd`` 1 or 2)."""
    if len(data) > MAX_FRAME:
        raise ProtocolError("message too large")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:
        raise ProtocolError(f"not msgpack: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a map")
    kind = message.get("t")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    if set(message) != {"t", *fields}:
        raise ProtocolError(f"{kind}: fields {sorted(set(message) - {'t'})}, not {sorted(fields)}")
    for name, want in fields.items():
        value = message[name]
        if not isinstance(value, want) or isinstance(value, bool):
            raise ProtocolError(f"{kind}: {name} must be {getattr(want, '__name__', want)}")
    if "fd" in message and message["fd"] not in (1, 2):
        raise ProtocolError(f"{kind}: fd must be 1 or 2")
    return message


def frame(payload: bytes) -> bytes:
    """A length-prefixed frame for the launcher's unix socket."""
    return struct.pack(">I", len(payload)) + payload


def read_frames(buffer: bytearray) -> list[bytes]:
    """Take every complete frame off the front of ``buffer`` (ProtocolError if one is too big)."""
    out = []
    while len(buffer) >= 4:
        (size,) = struct.unpack(">I", buffer[:4])
        if size > MAX_FRAME:
            raise ProtocolError("frame too large")
        if len(buffer) < 4 + size:
            break
        out.append(bytes(buffer[4 : 4 + size]))
        del buffer[: 4 + size]
    return out
