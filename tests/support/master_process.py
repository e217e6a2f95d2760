"""A master daemon as a real process on an ephemeral port, for integration tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.insecure import insecure_unless_curve
from support.polling import wait_for

#: Seconds the master may take to bind, or to exit once killed.
DEADLINE = 10.0


@dataclass
class MasterProcess:
    proc: subprocess.Popen[bytes]
    endpoint: str
    endpoint_file: Path
    log_file: Path

    def log_events(self) -> list[dict[str, Any]]:
        events = []
        for line in self.log_file.read_text().splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
        return events


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without any AGORA_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
    env.update(extra or {})
    return env


@contextmanager
def master_process(
    tmp_path: Path,
    *args: str,
    env: dict[str, str] | None = None,
    name: str = "master",
) -> Iterator[MasterProcess]:
    """Start ``python -m agora.master.server`` on an ephemeral port; kill it on the way out."""
    endpoint_file = tmp_path / f"{name}.endpoint"
    log_file = tmp_path / f"{name}.log"
    argv = [
        sys.executable,
        "-m",
        "agora.master.server",
        "--bind",
        "tcp://127.0.0.1:0",
        "--endpoint-file",
        str(endpoint_file),
        "--work-dir",
        str(tmp_path / f"{name}-work"),
        "--log-format",
        "json",
        *insecure_unless_curve(args),
        *args,
    ]
    with log_file.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, env=clean_env(env))
    try:

        def bound() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"master exited {proc.returncode}: {log_file.read_text()}")
            return (endpoint_file.exists() and endpoint_file.read_text().strip()) or None

        endpoint = wait_for(bound, DEADLINE, "the master's endpoint file")
        yield MasterProcess(proc, endpoint, endpoint_file, log_file)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=DEADLINE)
