"""ZeroMQ CURVE: keypairs, the server's ZAP handler (key file stem = principal) and the ACL."""

from __future__ import annotations

import asyncio
import os
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import zmq
import zmq.auth
from agora.sdk.discovery import client_key_files
from zmq.auth.asyncio import AsyncioAuthenticator
from zmq.utils import z85

__all__ = ["Acl", "AclError", "CurveClient", "CurveServer", "discover_client", "generate_keypair"]

log = structlog.get_logger(__name__)

ANY: Final = "*"


def generate_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write ``name.key`` (public) and ``name.key_secret`` (mode 0600) in pyzmq's format."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"bad key name {name!r}")
    os.makedirs(directory, exist_ok=True)
    public, secret = zmq.auth.create_certificates(os.fspath(directory), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def _load(path: str | os.PathLike[str], *, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(os.fspath(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load CURVE key {os.fspath(path)!r}: {exc}") from None
    if need_secret and secret is None:
        raise ValueError(f"{os.fspath(path)!r} holds no secret key (want the .key_secret file)")
    return public, secret


class CurveServer:
    """The server's keypair and the admitted clients: every ``*.key`` in ``authorized_keys_dir``,
    whose file stem is the client's principal (Received.principal)."""

    def __init__(
        self, secret_key_file: str | os.PathLike[str], authorized_keys_dir: str | os.PathLike[str]
    ) -> None:
        self.public_key, secret = _load(secret_key_file, need_secret=True)
        assert secret is not None
        self._secret_key = secret
        folder = Path(authorized_keys_dir)
        if not folder.is_dir():
            raise ValueError(f"authorized keys directory {str(folder)!r} does not exist")
        principals: dict[bytes, str] = {}
        for path in sorted(folder.glob("*.key")):
            public, _ = _load(path, need_secret=False)  # z85 text, as ZAP compares it
            if public in principals:
                raise ValueError(f"{str(path)!r} repeats the key of {principals[public]!r}")
            principals[public] = path.stem
        self.principals: Mapping[bytes, str] = principals  # z85 public key -> principal

    def configure_socket(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret_key)

    def start_authenticator(self, context: zmq.Context[Any]) -> AsyncioAuthenticator:
        """Start the ZAP handler on ``context`` (one per context; needs a running loop)."""
        asyncio.get_running_loop()  # the handler is a task: fail fast without a loop
        auth = _Authenticator(context, self.principals)
        try:
            auth.start()
        except zmq.ZMQError as exc:
            auth.stop()
            raise ValueError(f"cannot start the ZAP handler (one per context): {exc}") from None
        auth.configure_curve_callback(domain="*", credentials_provider=auth)
        return auth


class _Authenticator(AsyncioAuthenticator):
    """Admits exactly the authorized keys; the ZAP User-Id is the key's principal name."""

    def __init__(self, context: zmq.Context[Any], principals: Mapping[bytes, str]) -> None:
        super().__init__(context)
        self._principals = principals

    def callback(self, domain: str, z85_key: bytes) -> bool:
        if z85_key in self._principals:
            return True
        log.warning("curve_key_rejected", key=z85_key.decode("ascii", "replace"))
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        return self._principals[z85.encode(client_public_key)]


class CurveClient:
    """A client's keypair and the server's public key."""

    def __init__(
        self,
        secret_key_file: str | os.PathLike[str],
        server_public_key_file: str | os.PathLike[str],
    ) -> None:
        self.public_key, secret = _load(secret_key_file, need_secret=True)
        assert secret is not None
        self._secret_key = secret
        self.server_key, _ = _load(server_public_key_file, need_secret=False)

    def configure_socket(self, sock: zmq.Socket[Any]) -> None:
        sock.setsockopt(zmq.CURVE_SERVERKEY, self.server_key)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self._secret_key)


def discover_client(environ: Mapping[str, str] | None = None) -> CurveClient | None:
    """This user's credentials: ``$AGORA_CURVE_SECRET_KEY`` and ``$AGORA_CURVE_SERVER_KEY`` when
    set (both or neither: ValueError otherwise, or when a file is not the key it should be),
    else from ``$AGORA_HOME/keys`` (written by ``agora local``): its ``user-<name>.key_secret``
    and the masters' ``master.key``; None when they are not there, this user cannot read them
    (then the master, if it wants CURVE, refuses the handshake), or ``$AGORA_INSECURE`` is set
    (to reach a master started ``--insecure``)."""
    env = os.environ if environ is None else environ
    secret = env.get("AGORA_CURVE_SECRET_KEY", "").strip()
    server = env.get("AGORA_CURVE_SERVER_KEY", "").strip()
    if secret or server:
        if not (secret and server):
            raise ValueError(
                "set both AGORA_CURVE_SECRET_KEY and AGORA_CURVE_SERVER_KEY, or neither"
            )
        return CurveClient(secret, server)
    files = client_key_files(environ)
    if files is None:
        return None
    try:
        return CurveClient(*files)
    except ValueError:
        return None


class AclError(ValueError):
    """An ACL file that cannot be read or does not follow the format."""


@dataclass(frozen=True, slots=True)
class Acl:
    """Who may do what, by CURVE principal. ``Acl()`` allows everything.

    ``agents``/``operators``: principals allowed to register agents / make operator calls; ``"*"``
    = any admitted principal. ``roles``: principal -> roles it may subscribe with, the ``"*"`` key
    giving the default for principals not listed (role names are literal: ``"*"`` in a list is
    the default role); None = any role. A None principal (CURVE off) matches only ``"*"``.
    In a file, a missing ``agents`` means ``["*"]``, a missing ``operators`` means nobody and a
    missing ``[roles]`` table means any role.

    ``run_as``: principal -> Unix users its tasks may run as (``"*"`` in a list: any user; the
    ``"*"`` key: the default for principals not listed); None (no ``[run_as]`` table) = any user.
    ``default_user``: principal -> the user a task runs as when neither it nor its framework
    names one (the ``"*"`` key: default); without an entry, the principal's first ``run_as``
    user (unless that is ``"*"``).

    ``relays``: principals whose connections may carry the frames of agents behind them (see
    ``agora-relay``); a relayed frame acts as the principal the relay says it came from, so only
    principals named here (never ``"*"``) may relay, and only agents' messages.
    """

    agents: frozenset[str] = frozenset({ANY})
    operators: frozenset[str] = frozenset({ANY})
    roles: Mapping[str, frozenset[str]] | None = field(default=None)
    #: Principals that may send election traffic (other masters); in a file, missing means any.
    masters: frozenset[str] = frozenset({ANY})
    run_as: Mapping[str, tuple[str, ...]] | None = field(default=None)
    default_user: Mapping[str, str] = field(default_factory=dict)
    #: Principals whose connections may carry other agents' frames (``agora-relay``); nobody
    #: unless named, in a file or not: a relay vouches for the principals of the agents behind it.
    relays: frozenset[str] = frozenset()

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Acl:
        where = os.fspath(path)
        try:
            with open(where, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise AclError(f"cannot read ACL file {where!r}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise AclError(f"ACL file {where!r} is not valid TOML: {exc}") from None
        return cls.from_dict(data, source=where)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "ACL") -> Acl:
        known = {"agents", "operators", "roles", "masters", "run_as", "default_user", "relays"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise AclError(f"{source}: unknown key(s) {', '.join(unknown)}")
        agents = _names(data.get("agents", [ANY]), f"{source}: agents")
        operators = _names(data.get("operators", []), f"{source}: operators")
        masters = _names(data.get("masters", [ANY]), f"{source}: masters")
        relays = _names(data.get("relays", []), f"{source}: relays")
        if ANY in relays:
            raise AclError(f'{source}: relays must name principals, not "*"')
        table = data.get("roles")
        roles: dict[str, frozenset[str]] | None = None
        if table is not None:
            if not isinstance(table, dict):
                raise AclError(f"{source}: roles must be a table of principal = [roles]")
            roles = {str(k): _names(v, f"{source}: roles.{k}") for k, v in table.items()}
        run_as: dict[str, tuple[str, ...]] | None = None
        table = data.get("run_as")
        if table is not None:
            if not isinstance(table, dict):
                raise AclError(f"{source}: run_as must be a table of principal = [users]")
            run_as = {}
            for k, v in table.items():
                _names(v, f"{source}: run_as.{k}")
                run_as[str(k)] = tuple(dict.fromkeys(v))
        table = data.get("default_user", {})
        if not isinstance(table, dict) or not all(
            isinstance(v, str) and v and v != ANY for v in table.values()
        ):
            raise AclError(f'{source}: default_user must be a table of principal = "user"')
        defaults = {str(k): str(v) for k, v in table.items()}
        return cls(agents, operators, roles, masters, run_as, defaults, relays)

    def may_elect(self, principal: str | None) -> bool:
        """May ``principal`` take part in the masters' election (send RAFT_* messages)?"""
        return _allows(self.masters, principal)

    def may_register_agent(self, principal: str | None) -> bool:
        return _allows(self.agents, principal)

    def may_relay(self, principal: str | None) -> bool:
        """May ``principal``'s connection carry the frames of agents behind it?"""
        return principal is not None and principal in self.relays

    def may_operate(self, principal: str | None) -> bool:
        return _allows(self.operators, principal)

    def may_use_roles(self, principal: str | None, roles: Collection[str]) -> str | None:
        """None when ``principal`` may use every role in ``roles``, else the first denied one."""
        if self.roles is None:
            return None
        allowed = self.roles.get(principal, None) if principal is not None else None
        if allowed is None:
            allowed = self.roles.get(ANY, frozenset())
        for role in roles:
            if role not in allowed:
                return role
        return None


def _names(value: object, what: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise AclError(f"{what} must be a list of strings, got {type(value).__name__}")
    for item in value:
        if not isinstance(item, str) or not item:
            raise AclError(f"{what} must hold non-empty strings, got {item!r}")
    return frozenset(value)


def _allows(names: frozenset[str], principal: str | None) -> bool:
    return ANY in names or (principal is not None and principal in names)
