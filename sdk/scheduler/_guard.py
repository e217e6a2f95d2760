"""What keeps a scheduler's mistakes from failing silently: calls checked when they are made,
and a callback's exception reported in a few lines."""

from __future__ import annotations

import traceback
from typing import Final, TypeVar

from agora.sdk import codec
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import Message

__all__ = ["TRACEBACK_FRAMES", "checked", "short_traceback"]

M = TypeVar("M", bound=Message)

#: Frames of a callback's traceback that are logged (the innermost ones).
TRACEBACK_FRAMES: Final = 3


def checked(call: M) -> M:
    """``call`` if it can go on the wire; otherwise ValueError naming what is wrong (a task id
    too long, a bad resource, ...), raised to the caller before any offer is used up. The
    master would never see such a call: sending it would fail later, with nobody to tell."""
    try:
        codec.encode(call)
    except ProtocolError as exc:
        raise ValueError(f"cannot send {call.NAME}: {exc}") from None
    return call


def short_traceback(exc: BaseException) -> str:
    """The exception and its innermost frames: where a callback failed, without the driver's
    own frames around it."""
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__, limit=-TRACEBACK_FRAMES)
    return "".join(lines).rstrip()
