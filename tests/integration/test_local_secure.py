"""`agora local` is secure by default: a root-started cluster admits its own user's CLI without
flags, refuses another Unix user (`nobody`, who cannot read $AGORA_HOME/keys) at the handshake
with one line and exit 1, and never answers a client without CURVE."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import zmq
from agora.sdk.codec import decode, encode
from agora.sdk.messages.operator import GetState, StateReply
from agora.sdk.transport import CurveClient
from integration.test_cli import CMD_TIMEOUT, Local, _kill_everything, start_local

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the test drops to the user nobody"
)

#: Runs the CLI as nobody. The interpreter lives under /root, which nobody cannot read, so the
#: process starts as root, loads the CLI (with its plugins), then drops to nobody for good.
AS_NOBODY = """
import os, pwd, sys
from agora.sdk.cli.main import build_parser, main
build_parser()
who = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(who.pw_gid)
os.setuid(who.pw_uid)
assert os.geteuid() == who.pw_uid
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = start_local(tmp_path_factory.mktemp("agora-secure"), agents=1)
    try:
        yield cluster
    finally:
        _kill_everything(cluster)


def test_the_keys_are_private_and_every_daemon_uses_curve(local: Local) -> None:
    keys = local.home / "keys"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    me = f"user-{pwd.getpwuid(os.geteuid()).pw_name}"
    for name in ("master", "agent", "batch", me):
        assert stat.S_IMODE((keys / f"{name}.key_secret").stat().st_mode) == 0o600
    logs = local.work / "logs"
    for log in ("master.log", "agent-1.log", "batch.log"):
        assert "running_insecure" not in (logs / log).read_text(), log


def test_the_clusters_own_user_runs_a_task_without_flags(local: Local) -> None:
    out = local.agora("run", "--", "echo", "hi")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "hi\n"


def test_another_unix_user_is_refused_with_one_line(local: Local) -> None:
    env = dict(local.env, AGORA_MASTER=local.endpoint, HOME="/nonexistent")
    for args in (("run", "--", "echo", "hi"), ("state",)):
        t0 = time.monotonic()
        out = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, *args, "--timeout", "20"],
            env=env,
            capture_output=True,
            text=True,
            timeout=CMD_TIMEOUT,
        )
        assert out.returncode == 1, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "requires CURVE" in lines[0], out.stderr
        assert time.monotonic() - t0 < 15  # at the handshake, not at the end of --timeout
        assert out.stdout == ""


def test_a_client_without_curve_gets_no_answer(local: Local) -> None:
    keys = local.home / "keys"
    me = f"user-{pwd.getpwuid(os.geteuid()).pw_name}"
    ctx = zmq.Context()
    try:
        # The same request answered over CURVE with the user's keys ...
        curved = ctx.socket(zmq.DEALER)
        CurveClient(keys / f"{me}.key_secret", keys / "master.key").configure_socket(curved)
        curved.connect(local.endpoint)
        curved.send(encode(GetState()))
        assert curved.poll(20_000), "the master did not answer its own user"
        assert isinstance(decode(curved.recv()).message, StateReply)
        # ... and never over a plain link.
        plain = ctx.socket(zmq.DEALER)
        plain.connect(local.endpoint)
        plain.send(encode(GetState()))
        assert not plain.poll(2_000)
    finally:
        ctx.destroy(linger=0)
