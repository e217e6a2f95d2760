"""A framework author's own ``mypy --strict`` reads Agora's types under the editable install:
the Typing example of the framework guide checks clean as written, and a wrong call is caught."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _guide_example() -> str:
    """The Typing section's example in docs/framework-guide.md, as a user would copy it."""
    guide = (ROOT / "docs" / "framework-guide.md").read_text()
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", guide, flags=re.S) if "class Echo" in b
    ]
    return str(block)


BAD = """\
from agora.sdk import Offer, Scheduler, SchedulerCalls


class Wrong(Scheduler):
    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> None:
        driver.launch(offers[0], 5)
"""


def _mypy(tmp_path: Path, name: str, source: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / name
    path.write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), name],
        cwd=tmp_path,  # outside the repository, as a user's project is
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_users_strict_mypy_reads_agoras_types(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the dev extra")
    good = _mypy(tmp_path, "good.py", _guide_example())
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path, "bad.py", BAD)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Argument 2 to "launch"' in bad.stdout
