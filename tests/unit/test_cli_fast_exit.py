"""``agora run`` run as the process ends it the moment the command returns (os._exit, skipping the
interpreter's teardown), with what it wrote flushed first; called in-process it just returns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from agora.sdk.cli.main import main

#: A master nobody listens at: `agora run` gives up after its --timeout with its one-line error.
RUN = ["run", "--master", "tcp://127.0.0.1:9", "--timeout", "0.3", "--", "true"]


def test_the_process_exits_with_the_status_and_flushed_output() -> None:
    code = (
        "import sys\n"
        f"sys.argv = ['agora', *{RUN!r}]\n"
        "from agora.sdk.cli.main import main\n"
        "print('buffered', end='')\n"  # no newline: still in stdout's buffer when main() ends
        "main()\n"
        "print('after main')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "AGORA_INSECURE": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout == "buffered"  # flushed, and nothing after main() ran
    assert "agora run: could not subscribe" in done.stderr


def test_called_in_process_it_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGORA_INSECURE", "1")
    assert main(RUN) == 1
