"""``agora image import|list|rm``: the root filesystems in this machine's image store.

The store (``agora.sdk.daemon.images``, shared with the agent that runs the images) is imported
inside the commands, never when the CLI starts, to keep the CLI's start-up fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import TYPE_CHECKING, Any

from agora.sdk.cli.common import CliError

if TYPE_CHECKING:
    from agora.sdk.daemon.images import ImageRecord, ImageStore

__all__ = ["add_parser", "cmd_import", "cmd_list", "cmd_rm"]

_DESCRIPTION = """\
Root filesystems for containers, in the image store of this machine: --store DIR, else
$AGORA_IMAGE_STORE, else $AGORA_HOME/images, else /var/lib/agora/images (root) or
~/.local/share/agora/images.

examples:
  agora image import busybox busybox-rootfs.tar.gz   # a tarball (.tar, .tar.gz, .tar.xz, .tar.bz2)
  agora image import alpine ./alpine-rootfs/        # or a directory, copied
  agora image list
  agora image rm busybox
"""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    image = sub.add_parser(
        "image",
        help="root filesystems for containers (import, list, rm)",
        description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = image.add_subparsers(dest="image_command", metavar="ACTION", required=True)
    imp = actions.add_parser(
        "import",
        help="add an image from a tarball or a directory",
        description="Unpack a root filesystem tarball, or copy a directory, into the store as "
        "image NAME. Unsafe archives (members outside the root, links written through) are "
        "refused whole; device nodes and setuid bits are dropped.",
    )
    imp.add_argument("name", metavar="NAME")
    imp.add_argument("source", metavar="TARBALL|DIR")
    imp.add_argument("--replace", action="store_true", help="replace an image of that name")
    imp.add_argument("--json", action="store_true", help="print the image as JSON")
    _add_store(imp)
    imp.set_defaults(func=cmd_import)
    listing = actions.add_parser("list", help="the images in the store")
    listing.add_argument("--json", action="store_true", help="a JSON list")
    _add_store(listing)
    listing.set_defaults(func=cmd_list)
    rm = actions.add_parser("rm", help="delete an image")
    rm.add_argument("name", metavar="NAME")
    _add_store(rm)
    rm.set_defaults(func=cmd_rm)


def _add_store(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--store", metavar="DIR", help="the image store (see `agora image -h`)")


def _store(args: argparse.Namespace) -> ImageStore:
    from agora.sdk.daemon.images import ImageStore, default_image_store

    return ImageStore(args.store or default_image_store())


def _as_json(record: ImageRecord) -> dict[str, Any]:
    return dataclasses.asdict(record)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def cmd_import(args: argparse.Namespace) -> int:
    from agora.sdk.daemon.images import ImageError, image_name_problem

    if (problem := image_name_problem(args.name)) is not None:
        raise CliError(problem, 2)
    try:
        record = _store(args).import_image(args.name, args.source, replace=args.replace)
    except ImageError as exc:
        raise CliError(str(exc)) from None
    except OSError as exc:
        raise CliError(f"cannot write the image store: {exc.strerror or exc}") from None
    if args.json:
        print(json.dumps(_as_json(record), indent=2))
    else:
        print(f"imported image {record.name}: {_size(record.size_bytes)} in {record.rootfs}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    store = _store(args)
    records = store.list()
    if args.json:
        print(json.dumps([_as_json(r) for r in records], indent=2))
        return 0
    rows = [
        (
            r.name,
            _size(r.size_bytes),
            time.strftime("%Y-%m-%d %H:%M", time.localtime(r.imported_at)),
            r.source,
        )
        for r in records
    ]
    if not rows:
        print(f"no images in {store.root}")
        return 0
    header = ("NAME", "SIZE", "IMPORTED", "SOURCE")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]))
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from agora.sdk.daemon.images import ImageError, image_name_problem

    if (problem := image_name_problem(args.name)) is not None:
        raise CliError(problem, 2)
    try:
        removed = _store(args).remove(args.name)
    except (ImageError, OSError) as exc:
        raise CliError(str(exc)) from None
    if not removed:
        raise CliError(f"no image {args.name!r} in {_store(args).root}")
    print(f"removed image {args.name}")
    return 0
