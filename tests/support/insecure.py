"""Daemons without CURVE refuse to start unless told ``--insecure``: the kits say it for the tests
that do not give keys."""

from __future__ import annotations

from collections.abc import Iterable


def insecure_unless_curve(*argvs: Iterable[str]) -> tuple[str, ...]:
    """``("--insecure",)`` unless one of ``argvs`` gives a CURVE secret key (then CURVE is on,
    and the test means it) or already says ``--insecure``/``--no-insecure``."""
    for argv in argvs:
        for arg in argv:
            if arg in ("--insecure", "--no-insecure") or arg.startswith("--curve-secret-key"):
                return ()
    return ("--insecure",)
