"""The batch service as a real process against a test cluster, and `agora batch` against it.

The service serves TCP with a bearer token (an operator's: it may submit as any user); the kit's
calls and its CLI carry it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.polling import wait_for

DEADLINE = 30.0
#: The operator token the kit's service accepts over TCP (principal "tests").
TOKEN = "batch-tests-operator-token-0123456789"


@dataclass
class BatchService:
    """``python -m agora.frameworks.batch`` on ``work_dir`` for the master at ``master``."""

    master: str
    work_dir: Path
    args: Sequence[str] = ()
    proc: subprocess.Popen[bytes] | None = None
    url: str = ""
    starts: int = 0

    @property
    def url_file(self) -> Path:
        return self.work_dir / "batch.url"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGORA_")}
        env["AGORA_HOME"] = str(self.work_dir / "home")
        env["AGORA_HTTP_TOKEN"] = TOKEN
        return env

    @property
    def credentials(self) -> Path:
        return self.work_dir / "http-credentials.toml"

    def start(self) -> BatchService:
        self.url_file.unlink(missing_ok=True)
        self.credentials.write_text(f'tests = "{TOKEN}"\n', encoding="utf-8")
        self.starts += 1
        log = open(self.work_dir / f"batch-{self.starts}.log", "wb")  # noqa: SIM115
        with log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    *("-m", "agora.frameworks.batch"),
                    *("--master", self.master),
                    *("--work-dir", str(self.work_dir / "store")),
                    *("--endpoint-file", str(self.url_file)),
                    *("--retry-backoff", "0.2", "--log-format", "json"),
                    *("--http-credentials", str(self.credentials)),
                    *self.args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        proc = self.proc

        def ready() -> str | None:
            if proc.poll() is not None:
                raise AssertionError(f"batch service exited {proc.returncode}: {self.log()}")
            text = self.url_file.exists() and self.url_file.read_text().strip()
            return text or None

        self.url = wait_for(ready, DEADLINE, "the batch service's URL")
        wait_for(lambda: self.get("/health")["subscribed"], DEADLINE, "the batch subscription")
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.work_dir.glob("batch-*.log"))
        )

    # ---------------------------------------------------------------- the HTTP API

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {TOKEN}")
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def get(self, path: str) -> Any:
        status, body = self.call("GET", path)
        assert status == 200, (status, body)
        return body

    def job(self, job_id: int) -> dict[str, Any]:
        return dict(self.get(f"/jobs/{job_id}?tasks=0")["job"])

    def tasks(self, job_id: int) -> list[dict[str, Any]]:
        return list(self.get(f"/jobs/{job_id}")["tasks"])

    def wait_ended(self, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] not in ("PENDING", "RUNNING") else None

        return wait_for(ended, timeout, f"job {job_id} to end")

    # ---------------------------------------------------------------- the CLI

    def cli(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``agora batch ARGS… --batch URL`` (the subcommand first, then its arguments)."""
        argv = [sys.executable, "-m", "agora.sdk.cli", "batch", args[0], "--batch", self.url]
        return subprocess.run(
            [*argv, *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**self.env, "AGORA_MASTER": self.master},
        )

    def submit(self, *args: str) -> int:
        """``agora batch submit --json ARGS…``: the new job's id."""
        done = self.cli("submit", "--json", *args)
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["job_id"])
