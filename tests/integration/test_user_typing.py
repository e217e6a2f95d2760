"""A framework author's own ``mypy --strict`` reads Agora's types under the editable install:
the Typing example of the framework guide checks clean, and a wrong call is caught."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GOOD = '''\
from agora.sdk import FrameworkID, Offer, Scheduler, SchedulerCalls, TaskSpec, TaskStatus


class Echo(Scheduler):
    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> None:
        for offer in offers:
            driver.launch(offer, [TaskSpec("hello", "echo hello", "cpus:0.1;mem:32")])

    def status_update(self, driver: SchedulerCalls, status: TaskStatus) -> None:
        framework: FrameworkID | None = driver.framework_id
        print(framework, status.state)
'''

BAD = '''\
from agora.sdk import Offer, Scheduler, SchedulerCalls


class Wrong(Scheduler):
    def offers(self, driver: SchedulerCalls, offers: list[Offer]) -> None:
        driver.launch(offers[0], 5)
'''


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
    good = _mypy(tmp_path, "good.py", GOOD)
    assert good.returncode == 0, good.stdout + good.stderr
    bad = _mypy(tmp_path, "bad.py", BAD)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'Argument 2 to "launch"' in bad.stdout
