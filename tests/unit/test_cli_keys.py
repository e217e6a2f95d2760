"""`agora keys generate`, and the --curve-secret-key/--curve-server-key options of the commands
that talk to the master: parsing, environment defaults, both-or-neither, and how a refused
handshake becomes one line (against an in-process CURVE server)."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from agora.sdk.cli import main as cli_main
from agora.sdk.cli.common import (
    CURVE_SECRET_KEY_ENV,
    CURVE_SERVER_KEY_ENV,
    CliError,
    describe_handshake_error,
    guard_handshake,
    resolve_curve,
)
from agora.sdk.cli.keys import make_keypair
from agora.sdk.cli.main import build_parser
from agora.sdk.transport import CurveClient, CurveServer, ZmqServer, generate_keypair
from agora.sdk.transport import zmq_client as zmq_client_module

MASTER_COMMANDS = (
    ("state",),
    ("agents",),
    ("tasks",),
    ("kill", "t1"),
    ("run", "--", "true"),
)


def parse(*argv: str) -> Any:
    return build_parser().parse_args(list(argv))


@pytest.fixture(autouse=True)
def no_agora_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGORA_"):
            monkeypatch.delenv(name)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ------------------------------------------------------------------ agora keys generate


def test_generate_writes_a_loadable_keypair_and_prints_the_paths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "keys" / "deeper"  # created
    assert cli_main(["keys", "generate", "ops", "--dir", str(folder)]) == 0
    public, secret = folder / "ops.key", folder / "ops.key_secret"
    out = capsys.readouterr().out.splitlines()
    assert out == [f"public key: {public}", f"secret key: {secret}"]
    pub_key, none = zmq.auth.load_certificate(str(public))
    same_pub, secret_key = zmq.auth.load_certificate(str(secret))
    assert none is None and secret_key is not None and same_pub == pub_key
    CurveClient(secret, public)  # usable as a client's credentials


def test_generate_modes_secret_0600_public_by_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        public, secret = make_keypair(tmp_path, "agent-1")
    finally:
        os.umask(old)
    assert mode(secret) == 0o600
    assert mode(public) == 0o644
    assert os.umask(old) == old  # the umask was put back


def test_generate_defaults_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse("keys", "generate", "x").dir == "."
    monkeypatch.chdir(tmp_path)
    assert cli_main(["keys", "generate", "here"]) == 0
    assert (tmp_path / "here.key").is_file() and (tmp_path / "here.key_secret").is_file()


@pytest.mark.parametrize("existing", ["ops.key", "ops.key_secret"])
def test_generate_refuses_to_overwrite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], existing: str
) -> None:
    (tmp_path / existing).write_text("precious\n")
    assert cli_main(["keys", "generate", "ops", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "will not overwrite" in err[0] and existing in err[0]
    assert (tmp_path / existing).read_text() == "precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [existing]  # nothing else written


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", " padded"])
def test_generate_refuses_bad_names_with_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert cli_main(["keys", "generate", name, "--dir", str(tmp_path / "k")]) == 2
    assert "bad key name" in capsys.readouterr().err
    assert not (tmp_path / "k").exists() or not any((tmp_path / "k").iterdir())


def test_keys_needs_an_action() -> None:
    with pytest.raises(SystemExit) as exc:
        parse("keys")
    assert exc.value.code == 2


# ------------------------------------------------------------------ the CURVE options


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """(a client's secret key file, the master's public key file)."""
    _, secret = generate_keypair(tmp_path, "ops")
    master_public, _ = generate_keypair(tmp_path, "master")
    return secret, master_public


@pytest.mark.parametrize("command", MASTER_COMMANDS)
def test_every_master_command_takes_the_curve_options(
    command: tuple[str, ...], pair: tuple[Path, Path]
) -> None:
    name, *rest = command
    args = parse(name, *rest)
    assert (args.curve_secret_key, args.curve_server_key) == (None, None)
    assert resolve_curve(args) is None
    secret, server = pair
    flags = ("--curve-secret-key", str(secret), "--curve-server-key", str(server))
    args = parse(name, *flags, *rest)
    assert (args.curve_secret_key, args.curve_server_key) == (str(secret), str(server))
    curve = resolve_curve(args)
    assert curve is not None
    assert curve.server_key == zmq.auth.load_certificate(str(server))[0]


def test_the_environment_gives_the_defaults_and_flags_win(
    tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    secret, server = pair
    env = {CURVE_SECRET_KEY_ENV: str(secret), CURVE_SERVER_KEY_ENV: str(server)}
    assert (CURVE_SECRET_KEY_ENV, CURVE_SERVER_KEY_ENV) == (
        "AGORA_CURVE_SECRET_KEY",
        "AGORA_CURVE_SERVER_KEY",
    )
    curve = resolve_curve(parse("state"), env)
    assert curve is not None and curve.public_key == zmq.auth.load_certificate(str(secret))[0]
    # a flag replaces its variable
    _, other = generate_keypair(tmp_path, "other")
    curve = resolve_curve(parse("state", "--curve-secret-key", str(other)), env)
    assert curve is not None and curve.public_key == zmq.auth.load_certificate(str(other))[0]
    # empty variables are unset
    assert (
        resolve_curve(parse("state"), {CURVE_SECRET_KEY_ENV: "", CURVE_SERVER_KEY_ENV: " "}) is None
    )


def test_the_process_environment_is_the_default(
    monkeypatch: pytest.MonkeyPatch, pair: tuple[Path, Path]
) -> None:
    secret, server = pair
    monkeypatch.setenv("AGORA_CURVE_SECRET_KEY", str(secret))
    monkeypatch.setenv("AGORA_CURVE_SERVER_KEY", str(server))
    assert resolve_curve(parse("agents")) is not None


@pytest.mark.parametrize(
    ("argv", "env", "given", "missing"),
    [
        (("--curve-secret-key", "S"), {}, "--curve-secret-key", "--curve-server-key"),
        (("--curve-server-key", "P"), {}, "--curve-server-key", "--curve-secret-key"),
        ((), {CURVE_SECRET_KEY_ENV: "S"}, "$AGORA_CURVE_SECRET_KEY", "--curve-server-key"),
        ((), {CURVE_SERVER_KEY_ENV: "P"}, "$AGORA_CURVE_SERVER_KEY", "--curve-secret-key"),
        (("--curve-secret-key", "S"), {CURVE_SECRET_KEY_ENV: "T"}, "--curve-secret-key", "server"),
    ],
)
def test_both_or_neither_is_a_usage_error(
    argv: tuple[str, ...], env: dict[str, str], given: str, missing: str
) -> None:
    with pytest.raises(CliError) as exc:
        resolve_curve(parse("state", *argv), env)
    assert exc.value.code == 2
    text = str(exc.value)
    assert text.startswith(given) and missing in text and "both" in text


@pytest.mark.parametrize("command", MASTER_COMMANDS)
def test_half_a_pair_exits_2_in_one_line_before_any_connection(
    command: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name, *rest = command
    argv = [name, "--master", "tcp://127.0.0.1:1", "--curve-secret-key", "S", *rest]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"agora {name}: --curve-secret-key needs")


def test_unusable_key_files_exit_1(
    tmp_path: Path, pair: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    secret, server = pair
    with pytest.raises(CliError) as exc:
        resolve_curve(
            parse("state"),
            {CURVE_SECRET_KEY_ENV: str(tmp_path / "nope"), CURVE_SERVER_KEY_ENV: str(server)},
        )
    assert exc.value.code == 1
    assert str(exc.value) == f"$AGORA_CURVE_SECRET_KEY: no such file {tmp_path / 'nope'}"
    public_instead = secret.with_name("ops.key")
    args = parse(
        "state", "--curve-secret-key", str(public_instead), "--curve-server-key", str(server)
    )
    with pytest.raises(CliError) as exc:
        resolve_curve(args, {})
    assert exc.value.code == 1 and "no secret key" in str(exc.value)
    argv = ["kill", "t", "--curve-secret-key", str(tmp_path / "nope"), "--curve-server-key", "x"]
    assert cli_main(argv) == 1
    assert "no such file" in capsys.readouterr().err


# ------------------------------------------------------------------ refused handshakes


def test_the_handshake_errors_named_are_the_transports() -> None:
    known = set(zmq_client_module._FAILED.values())
    assert {"authentication failed", "protocol error", "handshake failed"} == known
    master = "tcp://h:1"
    assert "rejected this client's CURVE key" in describe_handshake_error(
        "authentication failed", master, True
    )
    for why in known - {"authentication failed"}:
        assert "requires CURVE" in describe_handshake_error(why, master, False)
    assert "does not use CURVE" in describe_handshake_error("protocol error", master, True)
    assert "--curve-server-key" in describe_handshake_error("handshake failed", master, True)
    for why in known:
        for curve in (False, True):
            line = describe_handshake_error(why, master, curve)
            assert master in line and why in line and "\n" not in line


def test_guard_handshake_against_a_curve_server(tmp_path: Path) -> None:
    own, authorized = tmp_path / "own", tmp_path / "authorized"
    _, master_secret = generate_keypair(own, "master")
    public, ops_secret = generate_keypair(own, "ops")
    authorized.mkdir()
    (authorized / public.name).write_bytes(public.read_bytes())
    _, rogue_secret = generate_keypair(own, "rogue")
    other_master_public, _ = generate_keypair(own, "other-master")
    master_public = own / "master.key"

    async def never() -> str:
        await asyncio.Event().wait()
        return "unreachable"

    async def main() -> None:
        server = ZmqServer.bind("tcp://127.0.0.1:0", curve=CurveServer(master_secret, authorized))
        ep = server.endpoint
        try:
            ok = await guard_handshake(
                ep, CurveClient(ops_secret, master_public), asyncio.sleep(0.3, result="done")
            )
            assert ok == "done"
            cases = [
                (None, "requires CURVE"),
                (CurveClient(rogue_secret, master_public), "rejected"),
                (CurveClient(ops_secret, other_master_public), "--curve-server-key"),
            ]
            for curve, words in cases:
                with pytest.raises(CliError) as exc:
                    async with asyncio.timeout(5):
                        await guard_handshake(ep, curve, never())
                assert words in str(exc.value) and exc.value.code == 1
        finally:
            server.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_guard_handshake_returns_the_work_when_nobody_answers() -> None:
    async def main() -> str:
        # nothing listens on port 1: no handshake, neither good nor bad; the work decides
        return await guard_handshake("tcp://127.0.0.1:1", None, asyncio.sleep(0.1, result="x"))

    assert asyncio.run(asyncio.wait_for(main(), 10)) == "x"
