"""The fetcher: local and HTTP sources, names, modes, safe extraction and the shared cache."""

from __future__ import annotations

import asyncio
import http.server
import io
import os
import stat
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from agora.agent.containers.fetcher import Fetcher, FetchError, unsafe_tar_member
from agora.sdk.messages.container import URI


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    path = tmp_path / "sandbox"
    path.mkdir()
    return path


@pytest.fixture
def fetcher(tmp_path: Path) -> Fetcher:
    return Fetcher(str(tmp_path / "cache"), http_timeout=5.0)


def listing(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    hits: list[str] = []

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.hits.append(path)
        body = self.files.get(path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, dict[str, bytes], list[str]]]:
    files: dict[str, bytes] = {}
    hits: list[str] = []
    handler = type("Handler", (_Handler,), {"files": files, "hits": hits})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", files, hits
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def make_tar(path: Path, members: dict[str, bytes], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def test_file_uri_and_absolute_path_are_copied(tmp_path: Path, sandbox: Path, fetcher: Fetcher):
    src = tmp_path / "my data.txt"
    src.write_bytes(b"hello")
    made = fetcher.fetch(URI(value=f"file://{str(src).replace(' ', '%20')}"), str(sandbox))
    assert made == str(sandbox / "my data.txt")
    assert (sandbox / "my data.txt").read_bytes() == b"hello"
    made = fetcher.fetch(URI(value=str(src), output_file="copy"), str(sandbox))
    assert Path(made).read_bytes() == b"hello"
    assert listing(sandbox) == ["copy", "my data.txt"]  # no temp files left
    assert not stat.S_IMODE(os.stat(made).st_mode) & 0o111


def test_executable_bit(tmp_path: Path, sandbox: Path, fetcher: Fetcher) -> None:
    src = tmp_path / "run.sh"
    src.write_text("#!/bin/sh\necho hi\n")
    made = fetcher.fetch(URI(value=str(src), executable=True), str(sandbox))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o755


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ".", ""])
def test_bad_output_file_is_refused(tmp_path: Path, sandbox: Path, fetcher: Fetcher, bad: str):
    src = tmp_path / "f"
    src.write_text("x")
    with pytest.raises(FetchError, match="not a plain file name"):
        fetcher.fetch(URI(value=str(src), output_file=bad), str(sandbox))
    assert listing(sandbox) == [] and listing(tmp_path) == ["f", "sandbox"]


@pytest.mark.parametrize("value", ["ftp://host/x", "s3://bucket/key", "relative/path", "hdfs:/x"])
def test_unsupported_scheme(sandbox: Path, fetcher: Fetcher, value: str) -> None:
    with pytest.raises(FetchError, match="unsupported scheme") as info:
        fetcher.fetch(URI(value=value), str(sandbox))
    assert value in str(info.value)


def test_missing_file_names_the_uri(tmp_path: Path, sandbox: Path, fetcher: Fetcher) -> None:
    value = f"file://{tmp_path}/nope.txt"
    with pytest.raises(FetchError, match=r"nope\.txt") as info:
        fetcher.fetch(URI(value=value), str(sandbox))
    assert value in str(info.value) and "No such file" in str(info.value)
    assert listing(sandbox) == []


@pytest.mark.parametrize("suffix,mode", [(".tar.gz", "w:gz"), (".tgz", "w:gz"), (".tar", "w")])
def test_tar_is_extracted(tmp_path: Path, sandbox: Path, fetcher: Fetcher, suffix: str, mode: str):
    archive = make_tar(tmp_path / f"app{suffix}", {"bin/app": b"A", "README": b"R"}, mode)
    made = fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert (sandbox / "bin" / "app").read_bytes() == b"A"
    assert (sandbox / "README").read_bytes() == b"R"
    assert made == str(sandbox / archive.name) and Path(made).exists()  # the archive is kept
    assert listing(sandbox) == sorted(["bin", "bin/app", "README", archive.name])


def test_extract_false_leaves_the_archive_alone(tmp_path: Path, sandbox: Path, fetcher: Fetcher):
    archive = make_tar(tmp_path / "app.tar.gz", {"x": b"x"})
    fetcher.fetch(URI(value=str(archive), extract=False), str(sandbox))
    assert listing(sandbox) == ["app.tar.gz"]


def test_zip_is_extracted_with_exec_bits(tmp_path: Path, sandbox: Path, fetcher: Fetcher) -> None:
    archive = tmp_path / "site.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("www/index.html", "<p>hi</p>")
        run = zipfile.ZipInfo("www/run")
        run.external_attr = (stat.S_IFREG | 0o755) << 16
        zf.writestr(run, "#!/bin/sh\n")
    fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert (sandbox / "www" / "index.html").read_text() == "<p>hi</p>"
    assert os.access(sandbox / "www" / "run", os.X_OK)


def test_tar_with_parent_member_is_refused(tmp_path: Path, sandbox: Path, fetcher: Fetcher):
    archive = make_tar(tmp_path / "evil.tar.gz", {"good": b"g", "../evil": b"e"})
    with pytest.raises(FetchError, match=r"evil\.tar\.gz"):
        fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert not (tmp_path / "evil").exists()
    assert listing(sandbox) == []  # nothing half-extracted, no archive, no temp files
    with tarfile.open(archive) as tar:  # the fallback check refuses it too
        problems = [unsafe_tar_member(m) for m in tar.getmembers()]
    assert problems == [None, "is outside the archive root"]


def test_tar_with_link_out_is_refused(tmp_path: Path, sandbox: Path, fetcher: Fetcher) -> None:
    archive = tmp_path / "link.tar"
    with tarfile.open(archive, "w") as tar:
        link = tarfile.TarInfo("etc")
        link.type = tarfile.SYMTYPE
        link.linkname = "../../"
        tar.addfile(link)
        info = tarfile.TarInfo("etc/passwd")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(FetchError):
        fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert listing(sandbox) == [] and listing(tmp_path) == ["link.tar", "sandbox"]
    with tarfile.open(archive) as tar:
        assert unsafe_tar_member(tar.getmember("etc")) == "links outside the archive root"


@pytest.mark.parametrize("name", ["../evil", "/abs/evil", "a/../../evil"])
def test_zip_escaping_member_is_refused(tmp_path: Path, sandbox: Path, fetcher: Fetcher, name):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("ok", "ok")
        zf.writestr(zipfile.ZipInfo(name), "evil")
    with pytest.raises(FetchError, match=r"evil\.zip"):
        fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert listing(sandbox) == [] and not (tmp_path / "evil").exists()


def test_zip_symlink_out_is_refused(tmp_path: Path, sandbox: Path, fetcher: Fetcher) -> None:
    archive = tmp_path / "link.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        link = zipfile.ZipInfo("up")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        zf.writestr(link, "../..")
    with pytest.raises(FetchError, match="links outside"):
        fetcher.fetch(URI(value=str(archive)), str(sandbox))
    assert listing(sandbox) == []


def test_http_download(sandbox: Path, fetcher: Fetcher, http_server) -> None:
    base, files, _ = http_server
    files["/dl/tool%20v1.bin"] = b"\x00\x01" * 50_000
    made = fetcher.fetch(URI(value=f"{base}/dl/tool%20v1.bin?token=abc"), str(sandbox))
    assert made == str(sandbox / "tool v1.bin")
    assert Path(made).read_bytes() == b"\x00\x01" * 50_000


def test_http_404_names_the_uri(sandbox: Path, fetcher: Fetcher, http_server) -> None:
    base, _, _ = http_server
    value = f"{base}/missing.tgz"
    with pytest.raises(FetchError, match="404") as info:
        fetcher.fetch(URI(value=value), str(sandbox))
    assert value in str(info.value)
    assert listing(sandbox) == []


def test_cache_hit_does_not_touch_the_source(tmp_path: Path, fetcher: Fetcher, http_server):
    base, files, hits = http_server
    files["/a.txt"] = b"cached"
    first, second = tmp_path / "s1", tmp_path / "s2"
    first.mkdir()
    second.mkdir()
    fetcher.fetch(URI(value=f"{base}/a.txt", cache=True), str(first))
    del files["/a.txt"]
    made = fetcher.fetch(URI(value=f"{base}/a.txt", cache=True), str(second))
    assert Path(made).read_bytes() == b"cached"
    assert hits == ["/a.txt"]
    # Another Fetcher on the same cache dir (another executor) hits as well.
    third = tmp_path / "s3"
    third.mkdir()
    Fetcher(str(tmp_path / "cache")).fetch(URI(value=f"{base}/a.txt", cache=True), str(third))
    assert (third / "a.txt").read_bytes() == b"cached" and hits == ["/a.txt"]


def test_cache_evicts_least_recently_used(tmp_path: Path, sandbox: Path) -> None:
    fetcher = Fetcher(str(tmp_path / "cache"), cache_max_bytes=100)
    sources = {}
    for name in "abc":
        sources[name] = tmp_path / name
        sources[name].write_bytes(name.encode() * 40)

    def fetch(name: str) -> None:
        fetcher.fetch(URI(value=str(sources[name]), cache=True), str(sandbox))

    fetch("a")
    fetch("b")
    fetch("a")  # a hit makes "a" the most recently used
    fetch("c")  # 120 bytes > 100: "b" goes
    for name in "abc":
        sources[name].unlink()
    fetch("a")
    fetch("c")
    with pytest.raises(FetchError, match="No such file"):
        fetch("b")
    cache_files = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert len(cache_files) == 2 and sum(p.stat().st_size for p in cache_files) == 80


def test_file_bigger_than_the_cache_is_fetched_not_cached(tmp_path: Path, sandbox: Path) -> None:
    fetcher = Fetcher(str(tmp_path / "cache"), cache_max_bytes=10)
    src = tmp_path / "big"
    src.write_bytes(b"x" * 11)
    made = fetcher.fetch(URI(value=str(src), cache=True), str(sandbox))
    assert Path(made).read_bytes() == b"x" * 11
    cache = tmp_path / "cache"
    assert not cache.exists() or [p for p in cache.iterdir() if not p.name.startswith(".")] == []


def test_fetch_all_stops_at_the_first_error(tmp_path: Path, sandbox: Path, fetcher: Fetcher):
    (tmp_path / "one").write_text("1")
    (tmp_path / "three").write_text("3")
    uris = [URI(value=str(tmp_path / n)) for n in ("one", "two", "three")]
    with pytest.raises(FetchError, match="two"):
        asyncio.run(asyncio.wait_for(fetcher.fetch_all(uris, str(sandbox)), 10))
    assert listing(sandbox) == ["one"]
    asyncio.run(asyncio.wait_for(fetcher.fetch_all([uris[0], uris[2]], str(sandbox)), 10))
    assert listing(sandbox) == ["one", "three"]


def test_member_check_without_tarfile_filters(
    tmp_path: Path, sandbox: Path, fetcher: Fetcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python < 3.11.4 has no filter="data": the fetcher's own member check must hold the line.
    monkeypatch.delattr(tarfile, "data_filter")
    evil = make_tar(tmp_path / "evil.tgz", {"good": b"g", "../evil": b"e"})
    with pytest.raises(FetchError, match="outside the archive root"):
        fetcher.fetch(URI(value=str(evil)), str(sandbox))
    assert listing(sandbox) == [] and not (tmp_path / "evil").exists()
    fetcher.fetch(URI(value=str(make_tar(tmp_path / "ok.tgz", {"d/f": b"f"}))), str(sandbox))
    assert (sandbox / "d" / "f").read_bytes() == b"f"
