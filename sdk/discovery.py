"""Where the master is, and this user's CURVE keys for it: one rule shared by the CLI, the SDK
drivers and the operator client."""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "DEFAULT_MASTER",
    "INSECURE_ENV",
    "MASTER_KEY",
    "agora_home",
    "client_key_files",
    "client_principal",
    "http_token",
    "insecure_client",
    "keys_dir",
    "master_address",
    "normalize_endpoint",
    "parse_masters",
]

DEFAULT_MASTER: Final = "tcp://127.0.0.1:5050"
#: The stem of the masters' shared key in :func:`keys_dir` (also their principal).
MASTER_KEY: Final = "master"
#: Set (``1``, ``true``, ``yes``, ``on``): clients look for no credentials in :func:`keys_dir`, to
#: reach a master started ``--insecure`` from an account that has keys of its own. (A daemon
#: reads the same variable as its ``--insecure``.)
INSECURE_ENV: Final = "AGORA_INSECURE"
_TRUE: Final = frozenset({"1", "true", "yes", "on"})


def agora_home(environ: Mapping[str, str] | None = None) -> Path:
    """``$AGORA_HOME``, or ``~/.agora`` (where ``agora local`` records its master's address)."""
    env = os.environ if environ is None else environ
    home = env.get("AGORA_HOME", "").strip()
    return Path(home).expanduser() if home else Path.home() / ".agora"


def keys_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$AGORA_HOME/keys``: where ``agora local`` keeps its CURVE keys (mode 0700)."""
    return agora_home(environ) / "keys"


def client_principal(uid: int | None = None) -> str:
    """``user-<login name>`` of ``uid`` (default: this process's user), the principal and key
    file stem ``agora local`` gives the user who starts it (``user-<uid>`` without a name)."""
    uid = os.geteuid() if uid is None else uid
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return "user-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", name).lstrip(".") or str(uid))


def insecure_client(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``$AGORA_INSECURE`` tells clients to skip key discovery (CURVE off unless keys
    are named explicitly, by flag or ``$AGORA_CURVE_*``)."""
    env = os.environ if environ is None else environ
    return env.get(INSECURE_ENV, "").strip().lower() in _TRUE


def client_key_files(environ: Mapping[str, str] | None = None) -> tuple[Path, Path] | None:
    """(this user's secret key, the masters' public key) in :func:`keys_dir`, when both are
    there and readable by this user; else None (no keys, another user's directory, or
    ``$AGORA_INSECURE`` set: see :func:`insecure_client`)."""
    if insecure_client(environ):
        return None
    folder = keys_dir(environ)
    secret, server = folder / f"{client_principal()}.key_secret", folder / f"{MASTER_KEY}.key"
    if all(os.path.isfile(p) and os.access(p, os.R_OK) for p in (secret, server)):
        return secret, server
    return None


def http_token(environ: Mapping[str, str] | None = None) -> str | None:
    """This user's bearer token for the daemons' HTTP APIs: ``$AGORA_HTTP_TOKEN``, else
    ``operator.token`` in :func:`keys_dir` when this user can read it (written by ``agora
    local``) and ``$AGORA_INSECURE`` is not set (the local cluster's token is not sent to
    another, insecure one); else None."""
    env = os.environ if environ is None else environ
    explicit = env.get("AGORA_HTTP_TOKEN", "").strip()
    if explicit:
        return explicit
    if insecure_client(env):
        return None
    try:
        token = (keys_dir(environ) / "operator.token").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def master_address(explicit: str | None = None, *, environ: Mapping[str, str] | None = None) -> str:
    """The master endpoint to use.

    In order: ``explicit`` (a flag), ``$AGORA_MASTER``, the first line of ``$AGORA_HOME/master``
    (written by ``agora local``), else ``tcp://127.0.0.1:5050``. Empty values are skipped. A bare
    ``host:port`` becomes ``tcp://host:port``.
    """
    env = os.environ if environ is None else environ
    for candidate in (explicit, env.get("AGORA_MASTER")):
        if candidate is not None and candidate.strip():
            return normalize_endpoint(candidate)
    try:
        text = (agora_home(env) / "master").read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    first = text.strip().splitlines()[0] if text.strip() else ""
    if first.strip():
        return normalize_endpoint(first)
    return DEFAULT_MASTER


def normalize_endpoint(address: str) -> str:
    """``host:port`` -> ``tcp://host:port``; an endpoint with a scheme stays as it is."""
    address = address.strip()
    return address if "://" in address else f"tcp://{address}"


def parse_masters(text: str) -> tuple[str, ...]:
    """Master endpoints from a comma list (``"h1:5050,h2:5050"`` or ``"tcp://h1:5050,..."``).

    Bare ``host:port`` items become ``tcp://host:port``; duplicates are dropped, order is kept.
    Raises ValueError naming the bad item for an empty item, a missing host or a bad port.
    """
    if not text.strip():
        raise ValueError("no master endpoints given")
    endpoints: dict[str, None] = {}
    for position, item in enumerate(text.split(","), start=1):
        endpoints[_checked(item, position)] = None
    return tuple(endpoints)


def _checked(item: str, position: int) -> str:
    if not item.strip():
        raise ValueError(f"master endpoint {position} is empty")
    endpoint = normalize_endpoint(item)
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        if not rest:
            raise ValueError(f"master endpoint {item.strip()!r} has no path")
        return endpoint
    if scheme != "tcp":
        raise ValueError(f"master endpoint {item.strip()!r}: unsupported scheme {scheme!r}")
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise ValueError(f"master endpoint {item.strip()!r} needs host:port")
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"master endpoint {item.strip()!r} has a bad port {port!r}")
    return endpoint
