"""The fault suite's CURVE identity set, made afresh for each run in the run's directory.

The masters share one keypair (``master``: the group's server key, and the principal they elect
each other as); every agent, every workload framework and ``agora run`` has a key of its own,
whose file stem is its principal; ``operator`` is the principal that may make operator calls (the
leader probe runs as it). Beside the keys: ``authorized/`` (the masters'
``--curve-authorized-keys``: every public key above), ``acl.toml`` (only the agents register,
only the masters elect, only ``operator`` operates; tasks run as the user running the suite) and
``http-credentials.toml`` (the agents' ``--http-credentials``: a bearer token each for
``operator`` and for ``agora run``, so that it reads back its own task's output from the
sandbox).

The folder is 0700 and the secret keys 0600, like ``agora local``'s keys: the processes in the
rig's network namespaces run as the same user on the same filesystem, so they read them where
they are.
"""

from __future__ import annotations

import os
import pwd
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agora.sdk.cli.local_keys import KeyFolder
from agora.sdk.discovery import MASTER_KEY
from agora.sdk.transport import CurveClient, generate_keypair

__all__ = ["OPERATOR_KEY", "FaultKeys"]

OPERATOR_KEY: Final = "operator"
#: The environment a client reads its keys and token from (``agora`` CLI; the workload too).
SECRET_ENV: Final = "AGORA_CURVE_SECRET_KEY"
SERVER_ENV: Final = "AGORA_CURVE_SERVER_KEY"
TOKEN_ENV: Final = "AGORA_HTTP_TOKEN"


@dataclass(frozen=True, slots=True)
class FaultKeys(KeyFolder):
    """Where each process's key files are; ``agents`` and ``clients`` name the principals."""

    agents: tuple[str, ...]
    clients: tuple[str, ...]
    #: principal -> its bearer token for the agents' HTTP API.
    tokens: Mapping[str, str]

    @classmethod
    def create(cls, folder: Path, agents: Iterable[str], clients: Iterable[str]) -> FaultKeys:
        """Make a fresh identity set in ``folder`` (which must not hold one already)."""
        agents, clients = tuple(agents), tuple(dict.fromkeys([*clients, OPERATOR_KEY]))
        names = (MASTER_KEY, *agents, *clients)
        if len(set(names)) != len(names):
            raise ValueError(f"key names repeat: {names}")
        umask = os.umask(0o077)
        try:
            folder.mkdir(parents=True)
            os.chmod(folder, 0o700)
            authorized = folder / "authorized"
            authorized.mkdir()
            for name in names:
                public, _ = generate_keypair(folder, name)  # the secret file: 0600
                (authorized / f"{name}.key").write_bytes(public.read_bytes())
            tokens = {name: secrets.token_urlsafe(32) for name in (OPERATOR_KEY, *clients)}
            keys = cls(folder, agents, clients, tokens)
            keys.acl.write_text(acl_text(agents, _login()), encoding="utf-8")
            lines = [f'operators = ["{OPERATOR_KEY}"]']
            lines += [f'"{name}" = "{token}"' for name, token in tokens.items()]
            keys.http_credentials.write_text("\n".join(lines) + "\n", encoding="utf-8")
        finally:
            os.umask(umask)
        return keys

    def master_flags(self) -> list[str]:
        """A master's CURVE flags (every member of the group has the same)."""
        return [
            *("--curve-secret-key", str(self.secret(MASTER_KEY))),
            *("--curve-authorized-keys", str(self.authorized)),
            *("--acl", str(self.acl)),
        ]

    def agent_flags(self, name: str) -> list[str]:
        """Agent ``name``'s CURVE flags and its HTTP API's credentials."""
        if name not in self.agents:
            raise KeyError(f"no agent key {name!r}")
        return [
            *("--curve-secret-key", str(self.secret(name))),
            *("--curve-server-key", str(self.public(MASTER_KEY))),
            *("--http-credentials", str(self.http_credentials)),
        ]

    def client_env(self, name: str) -> dict[str, str]:
        """The environment of client ``name`` (a framework, ``agora run``, the probe): its key,
        the masters' public key and its token for the agents' HTTP API."""
        if name not in self.clients:
            raise KeyError(f"no client key {name!r}")
        return {
            SECRET_ENV: str(self.secret(name)),
            SERVER_ENV: str(self.public(MASTER_KEY)),
            TOKEN_ENV: self.tokens[name],
        }

    def client(self, name: str) -> CurveClient:
        """Client ``name``'s credentials, loaded."""
        env = self.client_env(name)
        return CurveClient(env[SECRET_ENV], env[SERVER_ENV])


def acl_text(agents: Iterable[str], login: str) -> str:
    """The ACL: only ``agents`` register agents, only the masters elect, only ``operator`` makes
    operator calls; every principal's tasks run as ``login`` (also those naming no user)."""
    listed = ", ".join(f'"{a}"' for a in agents)
    return (
        "# Written by the fault suite for one run.\n"
        f"agents = [{listed}]\n"
        f'operators = ["{OPERATOR_KEY}"]\n'
        f'masters = ["{MASTER_KEY}"]\n'
        "\n"
        "[run_as]\n"
        f'"*" = ["{login}"]\n'
        "\n"
        "[default_user]\n"
        f'"*" = "{login}"\n'
    )


def _login() -> str:
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
