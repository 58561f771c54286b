"""Download, resume, verification and extraction against a local HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import io
import os
import socket
import tarfile
import threading
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from raydg import download
from raydg.archives import extract
from raydg.download import Archive, drive_url, fetch, verify
from raydg.errors import RaydgError

DRIVE_FORM = """<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head>
<body><p>Google Drive can't scan this file for viruses.</p>
<form id="download-form" action="{action}" method="get">
<input type="submit" id="uc-download-link" value="Download anyway"/>
<input type="hidden" name="id" value="FILEID"><input type="hidden" name="export" value="download">
<input type="hidden" name="confirm" value="t"><input type="hidden" name="uuid" value="a&amp;b">
</form></body></html>"""
QUOTA_PAGE = "<html><body><p>Too many users have viewed or downloaded this file.</p></body></html>"


@dataclass
class Route:
    """What the server answers on one path. kind: range, norange, drive, html, truncate, 404."""

    body: bytes
    kind: str = "range"


@dataclass
class Site:
    """Routes served by the test server, and the requests it received."""

    base: str = ""
    routes: dict[str, Route] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)

    def add(self, path: str, body: bytes, kind: str = "range") -> str:
        self.routes[path] = Route(body, kind)
        return self.base + path

    def ranges(self) -> list[str | None]:
        return [headers.get("Range") for _, headers in self.requests]


class Handler(BaseHTTPRequestHandler):
    @property
    def site(self) -> Site:
        return self.server.site  # set by the site fixture

    def do_GET(self) -> None:
        self.site.requests.append((self.path, dict(self.headers)))
        url = urllib.parse.urlsplit(self.path)
        route = self.site.routes.get(url.path)
        query = urllib.parse.parse_qs(url.query)
        if route is None or route.kind == "404":
            self._send(404, b"not found")
        elif route.kind == "html":
            self._send(200, QUOTA_PAGE.encode(), "text/html; charset=utf-8")
        elif route.kind == "drive" and query.get("confirm") != ["t"]:
            page = DRIVE_FORM.format(action=url.path)
            self._send(200, page.encode(), "text/html; charset=utf-8")
        elif route.kind == "drive" and query != {"id": ["FILEID"], "export": ["download"],
                                                 "confirm": ["t"], "uuid": ["a&b"]}:
            self._send(400, b"bad form resubmission")
        elif route.kind == "truncate":
            self._send(200, route.body[: len(route.body) // 2], length=len(route.body))
        elif route.kind != "norange" and self.headers.get("Range"):
            self._send_range(route.body, self.headers["Range"])
        else:
            self._send(200, route.body)

    def _send_range(self, body: bytes, header: str) -> None:
        start = int(header.removeprefix("bytes=").split("-")[0])
        if start >= len(body):
            self._send(416, b"", headers={"Content-Range": f"bytes */{len(body)}"})
        else:
            self._send(206, body[start:],
                       headers={"Content-Range": f"bytes {start}-{len(body) - 1}/{len(body)}"})

    def _send(self, status: int, body: bytes, ctype: str = "application/octet-stream",
              length: int | None = None, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server():
    """One server per module, in a daemon thread; always shut down."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def site(server):
    """Fresh routes and request log for each test."""
    server.site = Site(base=f"http://127.0.0.1:{server.server_address[1]}")
    return server.site


def payload(n: int = 200_000) -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(n))


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def make_zip(path: Path, files: dict[str, bytes]) -> bytes:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path.read_bytes()


def add_tar_member(tar: tarfile.TarFile, name: str, data: bytes = b"", **attrs: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for key, value in attrs.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data))


def test_drive_url():
    assert drive_url("1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd") == (
        "https://drive.usercontent.google.com/download"
        "?id=1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd&export=download")


def test_download_verifies_and_extracts_zip(site, tmp_path):
    files = {"PACS/art_painting/dog/pic_001.jpg": b"\xff\xd8dog", "PACS/sketch/README": b"hi"}
    data = make_zip(tmp_path / "src.zip", files)
    url = site.add("/pacs.zip", data)
    lines: list[str] = []
    archive = Archive(url, "pacs.zip", size=len(data), md5=md5(data))
    path = fetch(archive, tmp_path / "downloads", log=lines.append, timeout=5)
    assert path == tmp_path / "downloads" / "pacs.zip"
    assert path.read_bytes() == data
    assert not (tmp_path / "downloads" / "pacs.zip.part").exists()
    assert url in lines[0] and f"{len(data)} B" in lines[0]
    extract(path, tmp_path / "data", log=lines.append)
    for name, content in files.items():
        assert (tmp_path / "data" / name).read_bytes() == content
    assert lines[-1].startswith("extracted 2 files from pacs.zip")


def test_progress_is_logged_per_ten_percent_not_per_chunk(site, tmp_path, monkeypatch):
    monkeypatch.setattr(download, "_CHUNK", 1000)
    data = payload(100_000)  # 100 chunks
    lines: list[str] = []
    fetch(Archive(site.add("/big.bin", data), "big.bin"), tmp_path, log=lines.append, timeout=5)
    progress = [line for line in lines if "%" in line]
    assert [line.rsplit(" ", 1)[-1] for line in progress] == [f"{p}%" for p in range(10, 100, 10)]
    assert len(lines) == len(progress) + 2  # start and final line


def test_resume_sends_range_and_appends(site, tmp_path):
    data = payload()
    half = len(data) // 2
    (tmp_path / "mnist.gz.part").write_bytes(data[:half])
    url = site.add("/mnist.gz", data)
    lines: list[str] = []
    path = fetch(Archive(url, "mnist.gz", md5=md5(data)), tmp_path, log=lines.append, timeout=5)
    assert site.ranges() == [f"bytes={half}-"]
    assert path.read_bytes() == data
    assert "resuming" in lines[0]


def test_server_ignoring_range_restarts_from_zero(site, tmp_path):
    data = payload()
    (tmp_path / "f.bin.part").write_bytes(data[:1000])
    url = site.add("/f.bin", data, kind="norange")
    path = fetch(Archive(url, "f.bin", size=len(data), md5=md5(data)), tmp_path,
                 log=lambda _: None, timeout=5)
    assert site.ranges() == ["bytes=1000-"]
    assert path.read_bytes() == data


def test_complete_part_answered_416_is_only_verified(site, tmp_path):
    data = payload(5000)
    (tmp_path / "f.bin.part").write_bytes(data)
    url = site.add("/f.bin", data)
    path = fetch(Archive(url, "f.bin", md5=md5(data)), tmp_path, log=lambda _: None, timeout=5)
    assert site.ranges() == ["bytes=5000-"]
    assert path.read_bytes() == data


def test_interrupted_transfer_keeps_part_and_resumes(site, tmp_path):
    data = payload()
    url = site.add("/f.bin", data, kind="truncate")
    archive = Archive(url, "f.bin", size=len(data))
    with pytest.raises(RaydgError, match=r"cannot download .*connection closed after 100000 of"):
        fetch(archive, tmp_path, log=lambda _: None, timeout=5)
    assert (tmp_path / "f.bin.part").read_bytes() == data[: len(data) // 2]
    site.add("/f.bin", data)
    assert fetch(archive, tmp_path, log=lambda _: None, timeout=5).read_bytes() == data
    assert site.ranges() == [None, f"bytes={len(data) // 2}-"]


def test_md5_mismatch_deletes_file(site, tmp_path):
    data = payload(3000)
    url = site.add("/f.bin", data)
    with pytest.raises(RaydgError) as err:
        fetch(Archive(url, "f.bin", md5="0" * 32), tmp_path, log=lambda _: None, timeout=5)
    message = str(err.value)
    assert "f.bin" in message and "0" * 32 in message and md5(data) in message
    assert "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_verify_size_mismatch_names_file(tmp_path):
    path = tmp_path / "x.tar.gz"
    path.write_bytes(b"12345")
    with pytest.raises(RaydgError, match=r"x\.tar\.gz is corrupt: expected 6 bytes, got 5"):
        verify(path, Archive("http://unused", "x.tar.gz", size=6))
    assert not path.exists()


def test_offline_raises_one_line_error_and_keeps_part(tmp_path):
    with socket.socket() as sock:  # bound, never listening: connections are refused
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/domainnet/clipart.zip"
        (tmp_path / "clipart.zip.part").write_bytes(b"partial")
        with pytest.raises(RaydgError) as err:
            fetch(Archive(url, "clipart.zip"), tmp_path, log=lambda _: None, timeout=5)
    message = str(err.value)
    assert message.startswith(f"cannot download {url}: ")
    assert "offline?" in message and str(tmp_path / "clipart.zip") in message
    assert "\n" not in message
    assert (tmp_path / "clipart.zip.part").read_bytes() == b"partial"


def test_timeout_is_reported(tmp_path):
    with socket.socket() as sock:  # listening, never answering
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/slow.zip"
        with pytest.raises(RaydgError, match=r"cannot download .*/slow\.zip: timed out; check"):
            fetch(Archive(url, "slow.zip"), tmp_path, log=lambda _: None, timeout=0.2)


def test_http_error_is_reported(site, tmp_path):
    url = site.add("/gone.zip", b"", kind="404")
    with pytest.raises(RaydgError, match=r"cannot download .*/gone\.zip: HTTP 404"):
        fetch(Archive(url, "gone.zip"), tmp_path, log=lambda _: None, timeout=5)


def test_already_downloaded_makes_no_request(site, tmp_path):
    data = payload(1000)
    (tmp_path / "f.bin").write_bytes(data)
    url = site.add("/f.bin", b"different")
    lines: list[str] = []
    path = fetch(Archive(url, "f.bin", size=1000, md5=md5(data)), tmp_path, log=lines.append)
    assert path.read_bytes() == data
    assert site.requests == []
    assert lines == [f"{path}: already downloaded"]


def test_invalid_existing_file_is_downloaded_again(site, tmp_path):
    data = payload(1000)
    (tmp_path / "f.bin").write_bytes(b"stale")
    url = site.add("/f.bin", data)
    path = fetch(Archive(url, "f.bin", md5=md5(data)), tmp_path, log=lambda _: None, timeout=5)
    assert path.read_bytes() == data
    assert len(site.requests) == 1


def test_drive_confirmation_form_is_submitted(site, tmp_path):
    data = payload()
    url = site.add("/download", data, kind="drive") + "?id=FILEID&export=download"
    path = fetch(Archive(url, "PACS.zip", md5=md5(data)), tmp_path, log=lambda _: None, timeout=5)
    assert path.read_bytes() == data
    first, second = (urllib.parse.urlsplit(p) for p, _ in site.requests)
    assert "confirm" not in first.query
    assert urllib.parse.parse_qs(second.query)["uuid"] == ["a&b"]


def test_drive_page_without_form_is_an_error(site, tmp_path):
    url = site.add("/download", b"", kind="html") + "?id=FILEID&export=download"
    with pytest.raises(RaydgError) as err:
        fetch(Archive(url, "VLCS.tar.gz"), tmp_path, log=lambda _: None, timeout=5)
    message = str(err.value)
    assert message.startswith(f"cannot download {url}: ") and "HTML page" in message
    assert "quota" in message and "\n" not in message
    assert list(tmp_path.iterdir()) == []


def test_extract_refuses_zip_member_outside_dest(tmp_path):
    archive = tmp_path / "evil.zip"
    make_zip(archive, {"ok.txt": b"ok", "../evil.txt": b"pwned"})
    with pytest.raises(RaydgError, match=r"refusing archive member '\.\./evil\.txt'"):
        extract(archive, tmp_path / "dest", log=lambda _: None)
    assert not (tmp_path / "evil.txt").exists()
    assert not (tmp_path / "dest" / "ok.txt").exists()  # checked before anything is written


def test_extract_refuses_absolute_tar_member(tmp_path):
    archive = tmp_path / "evil.tar"
    target = tmp_path / "abs.txt"
    with tarfile.open(archive, "w") as tar:
        add_tar_member(tar, str(target), b"pwned")
    with pytest.raises(RaydgError, match=f"refusing archive member '{target}'"):
        extract(archive, tmp_path / "dest", log=lambda _: None)
    assert not target.exists()


def test_extract_refuses_tar_symlink_outside_dest(tmp_path):
    archive = tmp_path / "evil.tar"
    with tarfile.open(archive, "w") as tar:
        add_tar_member(tar, "data/link", type=tarfile.SYMTYPE, linkname="../../outside")
        add_tar_member(tar, "data/link/evil.txt", b"pwned")
    with pytest.raises(RaydgError, match=r"refusing archive member 'data/link': it links to"):
        extract(archive, tmp_path / "dest", log=lambda _: None)
    assert not (tmp_path / "outside").exists()
    assert not (tmp_path / "dest" / "data" / "link").is_symlink()


def test_extract_corrupt_archives(tmp_path):
    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(b"<html>quota exceeded</html>" * 100)
    with pytest.raises(RaydgError, match=r"cannot extract .*garbage\.zip: not a zip or tar"):
        extract(garbage, tmp_path / "a", log=lambda _: None)

    bad_crc = tmp_path / "crc.zip"
    with zipfile.ZipFile(bad_crc, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a.bin", b"A" * 1000)
    raw = bytearray(bad_crc.read_bytes())
    raw[raw.index(b"A" * 1000) + 500] ^= 0xFF
    bad_crc.write_bytes(bytes(raw))
    with pytest.raises(RaydgError, match=r"cannot extract .*crc\.zip: .*CRC"):
        extract(bad_crc, tmp_path / "b", log=lambda _: None)

    truncated = tmp_path / "cut.tar.gz"
    with tarfile.open(truncated, "w:gz") as tar:
        add_tar_member(tar, "noise.bin", os.urandom(100_000))
    truncated.write_bytes(truncated.read_bytes()[:50_000])
    with pytest.raises(RaydgError, match=r"cannot extract .*cut\.tar\.gz: .*truncated"):
        extract(truncated, tmp_path / "c", log=lambda _: None)


def test_extract_tar_gz(tmp_path):
    archive = tmp_path / "camelyon17_v1.0.tar.gz"
    files = {"camelyon17_v1.0/metadata.csv": b"patient,node\n", "camelyon17_v1.0/p/x.png": b"png"}
    with tarfile.open(archive, "w:gz") as tar:
        add_tar_member(tar, "camelyon17_v1.0", type=tarfile.DIRTYPE, mode=0o755)
        for name, data in files.items():
            add_tar_member(tar, name, data)
        add_tar_member(tar, "camelyon17_v1.0/meta.csv", type=tarfile.SYMTYPE,
                       linkname="metadata.csv")
    lines: list[str] = []
    extract(archive, tmp_path / "data", log=lines.append)
    for name, data in files.items():
        assert (tmp_path / "data" / name).read_bytes() == data
    assert (tmp_path / "data/camelyon17_v1.0/meta.csv").read_bytes() == b"patient,node\n"
    assert lines == [f"extracted 2 files from {archive.name} into {tmp_path / 'data'}"]
