"""``agora keys generate NAME``: a CURVE keypair for a master, an agent, a framework or an operator.

It writes ``NAME.key`` (the public key, to hand out) and ``NAME.key_secret`` (the secret key,
mode 0600, to keep) in pyzmq's certificate format. ``NAME`` is the principal: a master admits a
client whose ``NAME.key`` is in its ``--curve-authorized-keys`` directory under that name, and its
ACL speaks of it by that name.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from agora.sdk.cli.common import CliError
from agora.sdk.transport import generate_keypair

__all__ = ["add_parser", "cmd_generate", "make_keypair"]

_DESCRIPTION = """\
Make a CURVE keypair: NAME.key (public) and NAME.key_secret (secret, mode 0600) in DIR.
NAME is the principal the master knows the key's holder by: copy NAME.key into the master's
--curve-authorized-keys directory and name NAME in its ACL. Existing files are never overwritten.

examples:
  agora keys generate master --dir keys   # the master's: agora-master --curve-secret-key ...
  agora keys generate ops --dir keys      # an operator's; copy keys/ops.key to the master, then
  agora state --curve-secret-key keys/ops.key_secret --curve-server-key keys/master.key
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = sub.add_parser(
        "keys",
        help="CURVE keys for a master with authentication on",
        description="CURVE keys for a master with authentication on.",
    )
    actions = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    generate = actions.add_parser(
        "generate",
        help="make a keypair NAME.key / NAME.key_secret",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    generate.add_argument("name", metavar="NAME", help="the principal (the files' stem)")
    generate.add_argument(
        "--dir", default=".", metavar="DIR", help="where to write them (default: .; created)"
    )
    generate.set_defaults(func=cmd_generate)


def make_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write ``name.key`` and ``name.key_secret`` under ``directory``; (public, secret) paths.

    CliError with code 2 for a name that cannot be a key file's stem, code 1 when either file
    exists already (nothing is written then) or the files cannot be written.
    """
    if not name or name != name.strip() or "/" in name or name.startswith(".") or "\0" in name:
        raise CliError(f"bad key name {name!r}: want a plain file name, like ops or agent-1", 2)
    folder = Path(directory).expanduser()
    public, secret = folder / f"{name}.key", folder / f"{name}.key_secret"
    existing = [str(p) for p in (public, secret) if os.path.lexists(p)]
    if existing:
        raise CliError(
            f"will not overwrite {' and '.join(existing)}: remove it first, or pick "
            "another NAME or --dir"
        )
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"cannot create {folder}: {exc.strerror or exc}") from None
    # The secret key must never be readable by others, not even between write and chmod.
    umask = os.umask(0o077)
    try:
        made_public, made_secret = generate_keypair(folder, name)
    except OSError as exc:
        raise CliError(f"cannot write keys in {folder}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    finally:
        os.umask(umask)
    os.chmod(made_public, 0o644 & ~umask)
    return made_public, made_secret


def cmd_generate(args: argparse.Namespace) -> int:
    public, secret = make_keypair(args.dir, args.name)
    print(f"public key: {public}")
    print(f"secret key: {secret}")
    return 0
