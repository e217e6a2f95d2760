"""Errors raised by the SDK's wire layer."""

from __future__ import annotations

__all__ = ["ProtocolError"]


class ProtocolError(ValueError):
    """A frame or message that does not follow the wire contract.

    ``field`` is the dotted path of the offending value (``"SUBSCRIBE.framework_info.roles[2]"``)
    when one can be named, else ``None``. ``str(error)`` is the full, human-readable message.
    """

    field: str | None

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (str(self), self.field))


def _rebuild(message: str, field: str | None) -> ProtocolError:
    return ProtocolError(message, field=field)
