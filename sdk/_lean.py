"""Start-up discipline: importing what a path needs, and not what merely happens to be installed.

structlog imports rich, whenever it is installed, for its pretty console tracebacks: 40-70 ms on a
small machine, more than ``agora --help`` takes in all. The SDK's drivers and the CLI log a few
key-value lines and need none of it, so their entry points import structlog through
:func:`import_structlog_without_rich` first. rich itself stays importable: a command that draws
with it (``agora local``, ``agora top``) imports it as usual; structlog's console renderer then
prints plain tracebacks.
"""

from __future__ import annotations

import sys

__all__ = ["import_structlog_without_rich"]


def import_structlog_without_rich() -> None:
    """Import structlog with ``import rich`` failing for the while; a no-op once either is
    imported (nothing is then gained, and nothing already loaded changes)."""
    if "structlog" in sys.modules or "rich" in sys.modules:
        return
    sys.modules["rich"] = None  # type: ignore[assignment]  # makes ``import rich`` raise
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]
