"""Bearer tokens for the daemons' HTTP APIs (the master's operator calls, the agent's API): the
credentials file both read, and the constant-time token check. Pure apart from reading the file.

The file is TOML: one ``principal = "token"`` line per principal (tokens of at least 16
characters, each its own), and optionally ``operators = ["principal", ...]``: the principals the
agent treats as operators (they read every task's files). Without ``operators`` every principal
in the file is one. The master ignores ``operators``: its ACL says who is an operator.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HttpCredentials",
    "basic_principal",
    "bearer_principal",
    "header_principal",
    "load_credentials",
    "load_http_credentials",
]


@dataclass(frozen=True, slots=True)
class HttpCredentials:
    """token -> principal, and the principals that are operators."""

    tokens: Mapping[str, str]
    operators: frozenset[str]


def load_http_credentials(path: Path) -> HttpCredentials:
    """The credentials in ``path``; ValueError (naming the file) if unusable."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"HTTP credentials {path}: {exc}") from None
    listed = data.pop("operators", None)
    tokens: dict[str, str] = {}
    for principal, token in data.items():
        if not isinstance(token, str) or len(token) < 16:
            raise ValueError(
                f"HTTP credentials {path}: the token of {principal!r} must be a string of at "
                "least 16 characters"
            )
        if token in tokens:
            raise ValueError(f"HTTP credentials {path}: {principal!r} reuses another's token")
        tokens[token] = principal
    if not tokens:
        raise ValueError(f'HTTP credentials {path}: no principal = "token" entries')
    if listed is None:
        operators = frozenset(tokens.values())
    elif isinstance(listed, list) and all(isinstance(p, str) for p in listed):
        operators = frozenset(listed)
    else:
        raise ValueError(f"HTTP credentials {path}: operators must be a list of principals")
    return HttpCredentials(tokens=tokens, operators=operators)


def load_credentials(path: Path) -> dict[str, str]:
    """token -> principal from ``path`` (see :func:`load_http_credentials`)."""
    return dict(load_http_credentials(path).tokens)


def bearer_principal(header: str, tokens: Mapping[str, str]) -> str | None:
    """The principal of the ``Authorization: Bearer TOKEN`` header's token; None when the header
    is missing, not a bearer token, or the token unknown. Every known token is compared, in
    constant time, so the answer's timing does not tell how much of a guess was right."""
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    found = None
    for known, principal in tokens.items():
        if hmac.compare_digest(known.encode(), token.encode()):
            found = principal
    return found


def basic_principal(header: str, tokens: Mapping[str, str]) -> str | None:
    """The principal of an ``Authorization: Basic base64(principal:token)`` header (what Mesos
    tools send): None when the header is missing, not Basic, malformed, the token unknown, or the
    token another principal's. The token is compared as in :func:`bearer_principal`."""
    scheme, _, encoded = header.partition(" ")
    encoded = encoded.strip()
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, token = decoded.partition(":")
    if not sep or not token:
        return None
    found = bearer_principal(f"Bearer {token}", tokens)
    return found if found is not None and hmac.compare_digest(found, user) else None


def header_principal(header: str, tokens: Mapping[str, str]) -> str | None:
    """The principal of a Bearer or Basic ``Authorization`` header (None: not known)."""
    return bearer_principal(header, tokens) or basic_principal(header, tokens)
