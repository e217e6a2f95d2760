"""The CURVE identities of ``agora local``, kept in ``$AGORA_HOME/keys`` (mode 0700).

One keypair each for: the masters (``master``, shared by the members of a group, which is also
the principal they elect each other as), the agents (``agent``), the batch service (``batch``)
and the user who starts the cluster (``user-<name>``, see
:func:`agora.sdk.discovery.client_principal`). Secret keys are mode 0600; a keypair already there
is used again, so the keys outlive one ``agora local``. Beside them: ``authorized/``, the
masters' ``--curve-authorized-keys`` directory (the four public keys), ``acl.toml``, which
lets the agents register, the user make operator calls and run tasks as themself (as anyone when
root), the batch service run jobs as their submitters, and only the masters elect, and the
user's bearer token for operator calls over the masters' HTTP API: ``operator.token`` (made once,
then reused), named in the masters' ``--http-credentials`` file ``http-credentials.toml``.

Every other local user is refused at the handshake: they cannot read the directory, so they have
no admitted key.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agora.sdk.discovery import MASTER_KEY, client_principal
from agora.sdk.transport import generate_keypair

__all__ = ["AGENT_KEY", "BATCH_KEY", "KeyFolder", "LocalKeys", "acl_text", "ensure_local_keys"]

AGENT_KEY: Final = "agent"
BATCH_KEY: Final = "batch"


@dataclass(frozen=True, slots=True)
class KeyFolder:
    """The layout of an identity set's folder: ``NAME.key`` and ``NAME.key_secret`` per
    principal, the masters' ``authorized/`` keys, ``acl.toml`` and ``http-credentials.toml``."""

    folder: Path

    def secret(self, name: str) -> Path:
        return self.folder / f"{name}.key_secret"

    def public(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    @property
    def authorized(self) -> Path:
        return self.folder / "authorized"

    @property
    def acl(self) -> Path:
        return self.folder / "acl.toml"

    @property
    def http_credentials(self) -> Path:
        return self.folder / "http-credentials.toml"


@dataclass(frozen=True, slots=True)
class LocalKeys(KeyFolder):
    """Where each of ``agora local``'s daemons' and the user's key files are."""

    user: str  # the user's principal

    @property
    def token(self) -> Path:
        """The user's bearer token for the masters' HTTP operator calls."""
        return self.folder / "operator.token"

    def master_flags(self) -> list[str]:
        """The CURVE flags of a master (each member of a group has the same)."""
        return [
            *("--curve-secret-key", str(self.secret(MASTER_KEY))),
            *("--curve-authorized-keys", str(self.authorized)),
            *("--acl", str(self.acl)),
            *("--http-credentials", str(self.http_credentials)),
        ]

    def client_flags(self, name: str) -> list[str]:
        """The CURVE flags of a client daemon (an agent, the batch service) named ``name``."""
        return [
            *("--curve-secret-key", str(self.secret(name))),
            *("--curve-server-key", str(self.public(MASTER_KEY))),
        ]


def acl_text(user: str, login: str, *, root: bool = False) -> str:
    """The ACL admitting exactly ``agora local``'s principals (roles: any, for every one).
    ``login``: the Unix user who starts it: their tasks run as them (as anyone when ``root``),
    and so do tasks that name no user."""
    return (
        "# Written by agora local: who may do what, by CURVE principal.\n"
        f'agents = ["{AGENT_KEY}"]\n'
        f'operators = ["{user}"]\n'
        f'masters = ["{MASTER_KEY}"]\n'
        "\n"
        "# The Unix users each principal's tasks may run as. The batch service checks who\n"
        "# submitted a job and runs it as them; nobody else gets a key to this cluster.\n"
        "[run_as]\n"
        f'"{user}" = ["{"*" if root else login}"]\n'
        f'{BATCH_KEY} = ["*"]\n'
        '"*" = []\n'
        "\n"
        "# Tasks (and frameworks) that name no user run as the user who started agora local.\n"
        "[default_user]\n"
        f'"{user}" = "{login}"\n'
        f'{BATCH_KEY} = "{login}"\n'
    )


def _login(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def ensure_local_keys(folder: Path, user: str | None = None) -> LocalKeys:
    """Make (or reuse) the identity set in ``folder``; OSError when it cannot be written."""
    keys = LocalKeys(folder, user or client_principal())
    folder.parent.mkdir(parents=True, exist_ok=True)  # $AGORA_HOME itself: the usual mode
    umask = os.umask(0o077)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        names = (MASTER_KEY, AGENT_KEY, BATCH_KEY, keys.user)
        for name in names:
            public, secret = keys.public(name), keys.secret(name)
            if not (public.is_file() and secret.is_file()):
                for path in (public, secret):
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                generate_keypair(folder, name)
            os.chmod(secret, 0o600)
        # The authorized keys: exactly these principals (a stale file would admit its holder).
        # (Updated in place: another agora local on this home may be reading it.)
        authorized = keys.authorized
        authorized.mkdir(exist_ok=True)
        for stale in authorized.glob("*.key"):
            if stale.stem not in names:
                stale.unlink()
        for name in names:
            shutil.copyfile(keys.public(name), authorized / f"{name}.key")
        uid = os.geteuid()
        keys.acl.write_text(acl_text(keys.user, _login(uid), root=uid == 0), encoding="utf-8")
        token = keys.token.read_text(encoding="utf-8").strip() if keys.token.is_file() else ""
        if len(token) < 32:
            token = secrets.token_urlsafe(32)
            keys.token.write_text(token + "\n", encoding="utf-8")
        keys.http_credentials.write_text(f'"{keys.user}" = "{token}"\n', encoding="utf-8")
    finally:
        os.umask(umask)
    return keys
