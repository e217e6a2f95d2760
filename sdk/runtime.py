"""Where this Python and Agora live.

Agents keep these directories visible (read-only) in containers whose /tmp is private, so that an
executor written with the SDK runs in one even when the installation lives under /tmp; clients
use the same list to tell which of a job's paths the containers will see.
"""

from __future__ import annotations

import os
import sys

__all__ = ["runtime_paths"]


def runtime_paths() -> tuple[str, ...]:
    """This interpreter's prefixes and the directory holding Agora's packages, absolute (the
    SDK's parent: the agent, master and frameworks sit beside it, installed or checked out)."""
    import agora.sdk

    found = {sys.prefix, sys.exec_prefix, sys.base_prefix, os.path.dirname(sys.executable)}
    # Resolved: a checkout's editable install reaches the folders through pkg/agora's links,
    # and the checkout itself (which holds pkg/) is what must be visible.
    found.update(os.path.dirname(os.path.realpath(p)) for p in agora.sdk.__path__)
    return tuple(sorted(p for p in found if os.path.isabs(p)))
