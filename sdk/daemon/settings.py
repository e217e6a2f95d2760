"""Layered configuration: flags, then ``AGORA_*`` environment, then a TOML file, then defaults.

Each :class:`Option` names one setting once; its flag, environment variable and TOML key derive from
that name (``allocation_interval`` -> ``--allocation-interval``, ``AGORA_ALLOCATION_INTERVAL``, and
the TOML key ``allocation_interval`` or ``allocation-interval``). The TOML file comes from
``--config PATH`` or ``AGORA_CONFIG``. A bad value anywhere exits with status 2 and a message that
names where the value came from.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from agora.sdk.discovery import parse_masters

__all__ = [
    "Option",
    "load",
    "parse_bool",
    "parse_choice",
    "parse_duration",
    "parse_endpoint",
    "parse_master_list",
    "parse_optional_float",
    "parse_optional_path",
    "parse_port",
    "parse_positive_duration",
    "parse_positive_int",
]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass(frozen=True, slots=True)
class Option:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    flag: bool = False

    @property
    def cli(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "AGORA_" + self.name.upper()


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE - {''})}")


def parse_duration(text: str) -> float:
    """Seconds as a number, or with a unit suffix: ``250ms``, ``5s``, ``2m``, ``1h``."""
    t = text.strip().lower()
    scale = 1.0
    for suffix, factor in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], factor
            break
    value = float(t) * scale
    if not value >= 0 or value == float("inf"):
        raise ValueError("expected a finite, non-negative duration")
    return value


def parse_positive_duration(text: str) -> float:
    value = parse_duration(text)
    if value <= 0:
        raise ValueError("expected a duration > 0")
    return value


def parse_endpoint(text: str) -> str:
    """A ZeroMQ endpoint: ``tcp://host:port`` (port 0 or * binds a free one), ``ipc://``, ..."""
    value = text.strip()
    if not re.fullmatch(r"(tcp|ipc|inproc)://\S+", value):
        raise ValueError("expected a ZeroMQ endpoint like tcp://127.0.0.1:5050")
    return value


def parse_choice(choices: Sequence[str]) -> Callable[[str], str]:
    """A parser accepting one of ``choices`` (case-insensitive)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value

    return parse


def parse_port(text: str) -> int:
    """A TCP port, 0..65535 (0: let the system pick a free one)."""
    try:
        port = int(text.strip())
    except ValueError:
        raise ValueError("expected a port number (0: any free port)") from None
    if not 0 <= port <= 65_535:
        raise ValueError("expected a port number in 0..65535")
    return port


def parse_positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        out = int(text.strip())
    except ValueError:
        raise ValueError("expected a whole number") from None
    if out < 1:
        raise ValueError("expected a whole number >= 1")
    return out


def parse_optional_path(text: str) -> Path | None:
    """A path (``~`` expanded), or None when empty."""
    text = text.strip()
    return Path(text).expanduser() if text else None


def parse_master_list(text: str) -> tuple[str, ...]:
    """Master endpoints, comma-separated (empty: none)."""
    return parse_masters(text) if text.strip() else ()


def parse_optional_float(text: str) -> float | None:
    """A duration, or ``none``/empty for no limit."""
    return None if text.strip().lower() in ("", "none", "off") else parse_duration(text)


def load(
    prog: str,
    description: str,
    options: Sequence[Option],
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The value of every option; exits with status 2 on a bad flag, variable or file."""
    environ = os.environ if env is None else env
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", metavar="PATH", help="TOML file of settings (or AGORA_CONFIG)")
    for opt in options:
        default_text = "" if opt.flag else f" (default: {opt.default})"
        if opt.flag:
            parser.add_argument(
                opt.cli,
                dest=opt.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{opt.help}; env {opt.env}",
            )
        else:
            parser.add_argument(
                opt.cli,
                dest=opt.name,
                default=None,
                help=f"{opt.help}{default_text}; env {opt.env}",
            )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    config_path = args.config or environ.get("AGORA_CONFIG")
    from_file = _read_toml(prog, config_path, options) if config_path else {}

    values: dict[str, Any] = {}
    for opt in options:
        given = getattr(args, opt.name)
        if given is not None:
            values[opt.name] = given if opt.flag else _convert(prog, opt, given, opt.cli)
        elif opt.env in environ:
            source = f"environment variable {opt.env}"
            conv = parse_bool if opt.flag else opt.parse
            values[opt.name] = _convert(prog, opt, environ[opt.env], source, conv)
        elif opt.name in from_file:
            values[opt.name] = from_file[opt.name]
        else:
            values[opt.name] = opt.default
    return values


def _read_toml(prog: str, path: str, options: Sequence[Option]) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)
    except OSError as exc:
        _fail(prog, f"cannot read config file {path}: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        _fail(prog, f"config file {path} is not valid TOML: {exc}")
    known = {opt.name: opt for opt in options}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        opt = known.get(name)
        if opt is None:
            _fail(prog, f"config file {path}: unknown setting {key!r}")
        source = f"config file {path}, key {key!r}"
        if opt.flag:
            if not isinstance(value, bool):
                _fail(prog, f"{source}: expected true or false, got {value!r}")
            out[name] = value
        elif isinstance(value, list):
            out[name] = _convert(prog, opt, ",".join(str(v) for v in value), source)
        elif isinstance(value, dict):
            text = ",".join(f"{k}={v}" for k, v in value.items())
            out[name] = _convert(prog, opt, text, source)
        elif isinstance(value, bool):
            _fail(prog, f"{source}: expected a value, got a boolean")
        else:
            out[name] = _convert(prog, opt, str(value), source)
    return out


def _convert(
    prog: str,
    opt: Option,
    text: str,
    source: str,
    conv: Callable[[str], Any] | None = None,
) -> Any:
    try:
        return (conv or opt.parse)(text)
    except (ValueError, TypeError) as exc:
        _fail(prog, f"{source}: bad value {text!r} for {opt.name}: {exc}")


def _fail(prog: str, message: str) -> NoReturn:
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)
