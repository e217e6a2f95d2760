"""What keeps a scheduler's mistakes from failing silently: calls checked when they are made,
and a callback's exception reported in a few lines."""

from __future__ import annotations

import contextlib
import traceback
from typing import Any, Final, TypeVar

import structlog
from agora.sdk import codec
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import ErrorCode, Message

__all__ = ["TRACEBACK_FRAMES", "DriverError", "SafeLog", "checked", "short_traceback"]

M = TypeVar("M", bound=Message)

#: Frames of a callback's traceback that are logged (the innermost ones).
TRACEBACK_FRAMES: Final = 3


class DriverError(RuntimeError):
    """The driver stopped because the master ended the subscription (``code`` says why)."""

    def __init__(self, message: str, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.code = code


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


class SafeLog:
    """The module's structlog logger, except that a failing logger (say, a closed stream) is
    ignored: logging must never be what stops the driver."""

    def __init__(self, name: str) -> None:
        self._log = structlog.get_logger(name)

    def _emit(self, level: str, event: str, kw: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # nowhere left to report it
            getattr(self._log, level)(event, **kw)

    def debug(self, event: str, **kw: Any) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw: Any) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw: Any) -> None:
        self._emit("error", event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        self._emit("exception", event, kw)
