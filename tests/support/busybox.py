"""A tiny root filesystem for image tests: Debian's static busybox and a marker file.

``make test`` installs busybox-static when it runs as root (the only case these tests run in)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "cat", "ls", "ps", "echo", "sleep", "hostname", "test", "touch")
MARKER = "busybox-image"


def busybox_rootfs(root: Path) -> Path:
    """Fill ``root`` with /bin/busybox, applet links and /etc/agora-image; skip without it."""
    if not os.path.exists(BUSYBOX):
        pytest.skip("needs /bin/busybox: apt-get install -y busybox-static")
    (root / "bin").mkdir(parents=True)
    (root / "etc").mkdir()
    shutil.copy(BUSYBOX, root / "bin" / "busybox")
    for applet in APPLETS:
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "agora-image").write_text(f"{MARKER}\n")
    return root
