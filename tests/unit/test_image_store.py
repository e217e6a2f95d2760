"""The agent's image store: importing rootfs tarballs (safely) and directories, atomically;
listing and removing; and the `agora image` commands."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest
from agora.sdk.cli.main import main as cli_main
from agora.sdk.daemon.images import (
    ImageError,
    ImageStore,
    default_image_store,
    image_name_problem,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: device nodes, owners")

BUSYBOX = b"\x7fELF pretend busybox\n" * 100
PASSWD = b"root:x:0:0:root:/root:/bin/sh\n"
GROUP = b"root:x:0:\n"


def _add(archive: tarfile.TarFile, name: str, kind: bytes = tarfile.REGTYPE, **attrs: Any) -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    data: bytes = attrs.pop("data", b"")
    info.mode = attrs.pop("mode", 0o755 if kind == tarfile.DIRTYPE else 0o644)
    for key, value in attrs.items():
        setattr(info, key, value)
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    else:
        archive.addfile(info)


def busybox_tar(path: Path, mode: str = "w:gz", extra: list[dict[str, Any]] | None = None) -> Path:
    """A busybox-like rootfs: absolute applet links, a sticky /tmp, a setuid file, a hard link."""
    with tarfile.open(path, mode) as archive:
        _add(archive, "./", tarfile.DIRTYPE)
        for folder in ("bin", "etc", "usr", "usr/bin", "dev"):
            _add(archive, f"./{folder}", tarfile.DIRTYPE)
        _add(archive, "./tmp", tarfile.DIRTYPE, mode=0o1777)
        _add(archive, "./bin/busybox", data=BUSYBOX, mode=0o755)
        _add(archive, "./bin/sh", tarfile.SYMTYPE, linkname="/bin/busybox")
        _add(archive, "./usr/bin/env", tarfile.SYMTYPE, linkname="../../bin/busybox")
        _add(archive, "./bin/su", data=b"su\n", mode=0o4755)
        _add(archive, "./bin/ls", tarfile.LNKTYPE, linkname="bin/busybox")
        _add(archive, "./etc/passwd", data=PASSWD, uid=0, gid=0)
        _add(archive, "./etc/group", data=GROUP, uid=1234, gid=4321)
        for spec in extra or []:
            _add(archive, **spec)
    return path


def leftovers(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir()) if store.exists() else []


# --- tarballs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "mode"),
    [
        (".tar", "w"),
        (".tar.gz", "w:gz"),
        (".tgz", "w:gz"),
        (".tar.xz", "w:xz"),
        (".tar.bz2", "w:bz2"),
    ],
)
def test_import_busybox_tarball(tmp_path: Path, suffix: str, mode: str) -> None:
    tarball = busybox_tar(tmp_path / f"busybox{suffix}", mode)
    store = ImageStore(str(tmp_path / "store"))
    record = store.import_image("busybox", str(tarball))

    rootfs = Path(record.rootfs)
    assert rootfs == tmp_path / "store" / "busybox" / "rootfs" and rootfs.is_absolute()
    assert (rootfs / "bin" / "busybox").read_bytes() == BUSYBOX
    assert os.readlink(rootfs / "bin" / "sh") == "/bin/busybox"  # absolute, kept as is
    assert os.readlink(rootfs / "usr" / "bin" / "env") == "../../bin/busybox"
    assert (rootfs / "bin" / "ls").stat().st_ino == (rootfs / "bin" / "busybox").stat().st_ino
    assert stat.S_IMODE((rootfs / "tmp").stat().st_mode) == 0o1777
    assert stat.S_IMODE((rootfs / "bin" / "su").stat().st_mode) == 0o755  # no setuid
    assert record.size_bytes == len(BUSYBOX) + len(b"su\n") + len(PASSWD) + len(
        GROUP
    )  # the hard link once
    assert record.source == str(tarball) and record.name == "busybox"

    saved = json.loads((tmp_path / "store" / "busybox" / "image.json").read_text())
    assert set(saved) == {"name", "imported_at", "source", "size_bytes"}
    assert store.get("busybox") == record
    assert leftovers(tmp_path / "store") == ["busybox"]


@root_only
def test_import_keeps_numeric_owners_as_root(tmp_path: Path) -> None:
    record = ImageStore(str(tmp_path / "s")).import_image("b", str(busybox_tar(tmp_path / "b.tgz")))
    owner = (Path(record.rootfs) / "etc" / "group").stat()
    assert (owner.st_uid, owner.st_gid) == (1234, 4321)


def test_absolute_member_names_land_inside(tmp_path: Path) -> None:
    tarball = busybox_tar(tmp_path / "b.tar", "w", [{"name": "/etc/hostname", "data": b"box\n"}])
    record = ImageStore(str(tmp_path / "s")).import_image("b", str(tarball))
    assert (Path(record.rootfs) / "etc" / "hostname").read_bytes() == b"box\n"


def test_device_nodes_are_skipped(tmp_path: Path) -> None:
    devices = [
        {"name": "./dev/null", "kind": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3},
        {"name": "./dev/sda", "kind": tarfile.BLKTYPE, "devmajor": 8, "devminor": 0},
    ]
    tarball = busybox_tar(tmp_path / "b.tgz", extra=devices)
    record = ImageStore(str(tmp_path / "s")).import_image("b", str(tarball))
    assert os.listdir(Path(record.rootfs) / "dev") == []
    assert (Path(record.rootfs) / "bin" / "busybox").exists()


UNSAFE = {
    "parent member": [{"name": "../x", "data": b"pwned"}],
    "nested parent member": [{"name": "./etc/../../x", "data": b"pwned"}],
    "write through an absolute symlink": [
        {"name": "./evil", "kind": tarfile.SYMTYPE, "linkname": "{outside}"},
        {"name": "./evil/x", "data": b"pwned"},
    ],
    "write through an absolute symlink with dot-dots": [
        {"name": "./evil", "kind": tarfile.SYMTYPE, "linkname": "/../../../../../../{outside}"},
        {"name": "./evil/x", "data": b"pwned"},
    ],
    "write through a chain of symlinks": [
        {"name": "./etc/a", "kind": tarfile.SYMTYPE, "linkname": "{outside}"},
        {"name": "./etc/b", "kind": tarfile.SYMTYPE, "linkname": "a"},
        {"name": "./etc/b/x", "data": b"pwned"},
    ],
    "overwrite a symlink's target": [
        {"name": "./x", "kind": tarfile.SYMTYPE, "linkname": "{outside}/x"},
        {"name": "./x", "data": b"pwned"},
    ],
    "hard link through a symlink": [
        {"name": "./evil", "kind": tarfile.SYMTYPE, "linkname": "{outside}/secret"},
        {"name": "./stolen", "kind": tarfile.LNKTYPE, "linkname": "evil"},
    ],
    "hard link outside": [{"name": "./stolen", "kind": tarfile.LNKTYPE, "linkname": "../x"}],
    "hard link to a device": [
        {"name": "./dev/null", "kind": tarfile.CHRTYPE, "devmajor": 1, "devminor": 3},
        {"name": "./null2", "kind": tarfile.LNKTYPE, "linkname": "dev/null"},
    ],
    "relative symlink leaving the image": [
        {"name": "./etc/up", "kind": tarfile.SYMTYPE, "linkname": "../../x"},
    ],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_tarball_is_refused_whole(tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("secret")
    extra = [
        {k: v.format(outside=outside) if isinstance(v, str) else v for k, v in spec.items()}
        for spec in UNSAFE[case]
    ]
    tarball = busybox_tar(tmp_path / "bad.tgz", extra=extra)
    store = ImageStore(str(tmp_path / "store" / "images"))
    with pytest.raises(ImageError, match="unsafe member"):
        store.import_image("bad", str(tarball))
    assert sorted(os.listdir(outside)) == ["secret"]
    assert (outside / "secret").read_text() == "secret"
    assert not (tmp_path / "store" / "x").exists() and not (tmp_path / "x").exists()
    assert leftovers(tmp_path / "store" / "images") == []  # no image, no temporary dir
    assert store.get("bad") is None and store.list() == []


def test_not_a_tarball_or_missing(tmp_path: Path) -> None:
    store = ImageStore(str(tmp_path / "s"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ImageError, match="not a tar archive"):
        store.import_image("x", str(tmp_path / "notes.txt"))
    with pytest.raises(ImageError, match="no such file"):
        store.import_image("x", str(tmp_path / "nothing.tar"))
    truncated = tmp_path / "cut.tar.gz"
    truncated.write_bytes(busybox_tar(tmp_path / "whole.tgz").read_bytes()[:300])
    with pytest.raises(ImageError):
        store.import_image("x", str(truncated))
    assert leftovers(tmp_path / "s") == []


# --- directories --------------------------------------------------------------------------


def test_import_directory_copies_links_as_links(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "bin").mkdir(parents=True)
    (src / "bin" / "busybox").write_bytes(BUSYBOX)
    (src / "bin" / "busybox").chmod(0o4755)
    os.symlink("/bin/busybox", src / "bin" / "sh")
    os.symlink("busybox", src / "bin" / "cat")
    os.link(src / "bin" / "busybox", src / "bin" / "ls")
    os.mkfifo(src / "fifo")
    (src / "tmp").mkdir()
    (src / "tmp").chmod(0o1777)
    os.symlink("/nonexistent/dir", src / "dangling")

    record = ImageStore(str(tmp_path / "s")).import_image("dir", str(src))
    rootfs = Path(record.rootfs)
    assert os.readlink(rootfs / "bin" / "sh") == "/bin/busybox"
    assert os.readlink(rootfs / "bin" / "cat") == "busybox"
    assert os.readlink(rootfs / "dangling") == "/nonexistent/dir"
    assert (rootfs / "bin" / "busybox").read_bytes() == BUSYBOX
    assert stat.S_IMODE((rootfs / "bin" / "busybox").stat().st_mode) == 0o755
    assert (rootfs / "bin" / "ls").stat().st_ino == (rootfs / "bin" / "busybox").stat().st_ino
    assert stat.S_ISFIFO((rootfs / "fifo").lstat().st_mode)
    assert stat.S_IMODE((rootfs / "tmp").stat().st_mode) == 0o1777
    assert record.size_bytes == len(BUSYBOX)
    assert record.source == str(src)


@root_only
def test_directory_import_skips_device_nodes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "dev").mkdir(parents=True)
    os.mknod(src / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    (src / "dev" / "keep").write_text("k")
    record = ImageStore(str(tmp_path / "s")).import_image("d", str(src))
    assert os.listdir(Path(record.rootfs) / "dev") == ["keep"]


def test_directory_holding_the_store_does_not_copy_it(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "motd").write_text("hi")
    store = ImageStore(str(tmp_path / "images"))
    record = store.import_image("self", str(tmp_path))
    assert (Path(record.rootfs) / "etc" / "motd").read_text() == "hi"
    assert not (Path(record.rootfs) / "images").exists()


# --- names, replace, list, rm -------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-x", "a..b", "x" * 129, "é"])
def test_bad_names(tmp_path: Path, name: str) -> None:
    assert image_name_problem(name) is not None
    with pytest.raises(ImageError, match="bad image name"):
        ImageStore(str(tmp_path)).import_image(name, str(tmp_path))


@pytest.mark.parametrize("name", ["busybox", "alpine-3.19", "u_22.04", "A" * 128])
def test_good_names(name: str) -> None:
    assert image_name_problem(name) is None


def test_existing_name_refused_then_replaced(tmp_path: Path) -> None:
    store = ImageStore(str(tmp_path / "s"))
    first = tmp_path / "one"
    (first / "etc").mkdir(parents=True)
    (first / "etc" / "version").write_text("1")
    store.import_image("img", str(first))
    second = tmp_path / "two"
    (second / "etc").mkdir(parents=True)
    (second / "etc" / "version").write_text("2")

    with pytest.raises(ImageError, match="exists already"):
        store.import_image("img", str(second))
    record = store.get("img")
    assert record is not None and (Path(record.rootfs) / "etc" / "version").read_text() == "1"

    # A failed replacement keeps the old image.
    bad = busybox_tar(tmp_path / "bad.tgz", extra=[{"name": "../x", "data": b""}])
    with pytest.raises(ImageError):
        store.import_image("img", str(bad), replace=True)
    assert (Path(record.rootfs) / "etc" / "version").read_text() == "1"

    replaced = store.import_image("img", str(second), replace=True)
    assert (Path(replaced.rootfs) / "etc" / "version").read_text() == "2"
    assert replaced.source == str(second)
    assert leftovers(tmp_path / "s") == ["img"]


def test_list_and_remove(tmp_path: Path) -> None:
    store = ImageStore(str(tmp_path / "s"))
    assert store.list() == []  # no store yet
    tarball = busybox_tar(tmp_path / "b.tgz")
    for name in ("zeta", "alpha", "mid"):
        store.import_image(name, str(tarball))
    (tmp_path / "s" / "broken").mkdir()  # no image.json: not an image
    assert [r.name for r in store.list()] == ["alpha", "mid", "zeta"]

    assert store.remove("mid") is True
    assert store.remove("mid") is False
    assert store.get("mid") is None
    assert [r.name for r in store.list()] == ["alpha", "zeta"]
    assert leftovers(tmp_path / "s") == ["alpha", "broken", "zeta"]


def test_default_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AGORA_IMAGE_STORE", "/srv/images")
    monkeypatch.setenv("AGORA_HOME", str(tmp_path))
    assert default_image_store() == "/srv/images"
    monkeypatch.delenv("AGORA_IMAGE_STORE")
    assert default_image_store() == str(tmp_path / "images")
    monkeypatch.delenv("AGORA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = (
        "/var/lib/agora/images" if os.geteuid() == 0 else f"{tmp_path}/.local/share/agora/images"
    )
    assert default_image_store() == expected


# --- the CLI ------------------------------------------------------------------------------


def test_cli_import_list_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "store")
    tarball = str(busybox_tar(tmp_path / "busybox.tar.gz"))

    assert cli_main(["image", "import", "busybox", tarball, "--store", store]) == 0
    assert "imported image busybox" in capsys.readouterr().out

    assert cli_main(["image", "import", "busybox", tarball, "--store", store]) == 1
    assert "exists already" in capsys.readouterr().err

    assert cli_main(["image", "import", "bb", tarball, "--store", store, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == "bb" and shown["rootfs"] == f"{store}/bb/rootfs"

    assert cli_main(["image", "list", "--store", store, "--json"]) == 0
    assert [i["name"] for i in json.loads(capsys.readouterr().out)] == ["bb", "busybox"]
    assert cli_main(["image", "list", "--store", store]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "IMPORTED", "SOURCE"]
    assert [line.split()[0] for line in table[1:]] == ["bb", "busybox"]

    assert cli_main(["image", "rm", "bb", "--store", store]) == 0
    assert cli_main(["image", "rm", "bb", "--store", store]) == 1
    assert "no image 'bb'" in capsys.readouterr().err
    assert [r.name for r in ImageStore(store).list()] == ["busybox"]


def test_cli_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "store")
    assert cli_main(["image", "import", "../x", str(tmp_path), "--store", store]) == 2
    assert "bad image name" in capsys.readouterr().err
    bad = str(busybox_tar(tmp_path / "bad.tgz", extra=[{"name": "../x", "data": b""}]))
    assert cli_main(["image", "import", "bad", bad, "--store", store]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agora image: unsafe member") and err.count("\n") == 1
    assert cli_main(["image", "list", "--store", store]) == 0
    assert "no images" in capsys.readouterr().out


def test_cli_uses_agora_image_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGORA_IMAGE_STORE", str(tmp_path / "env-store"))
    assert cli_main(["image", "import", "b", str(busybox_tar(tmp_path / "b.tgz"))]) == 0
    assert (tmp_path / "env-store" / "b" / "rootfs" / "bin" / "busybox").exists()


def test_remove_image_with_read_only_directories(tmp_path: Path) -> None:
    extra = [
        {"name": "./ro", "kind": tarfile.DIRTYPE, "mode": 0o555},
        {"name": "./ro/sub", "kind": tarfile.DIRTYPE, "mode": 0o500},
        {"name": "./ro/sub/file", "data": b"x", "mode": 0o444},
    ]
    store = ImageStore(str(tmp_path / "s"))
    record = store.import_image("ro", str(busybox_tar(tmp_path / "ro.tgz", extra=extra)))
    assert stat.S_IMODE((Path(record.rootfs) / "ro").stat().st_mode) == 0o555
    assert store.remove("ro") is True
    assert leftovers(tmp_path / "s") == []
