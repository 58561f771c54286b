"""The Hub mirror of PACS, made here and served from 127.0.0.1 at the Hub's URL layout
(``HF_ENDPOINT``): a resumed download, a refused corrupt file, the fallback to the original
source, and the same images from the Parquet and the folder paths."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import random
import threading
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from raydg.cli import cli
from raydg.datasets import DATASETS, HubMirror, hub, load_dataset
from raydg.datasets.folders import PACS_MIRROR
from raydg.datasets.manage import check, download
from raydg.download import Archive, file_digest

REPO, COMMIT = PACS_MIRROR.repo, PACS_MIRROR.revision
DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
CLASSES = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]  # the card's
SHARDS = ("data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet")
PER_CLASS = 2


def _images() -> list[tuple[str, int, str, bytes]]:
    """(domain, label, file name, encoded image): random 12x12 pictures, JPEG and PNG."""
    rng, out = np.random.default_rng(0), []
    for d in DOMAINS:
        for label, c in enumerate(CLASSES):
            for i in range(PER_CLASS):
                pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
                fmt = ("JPEG", "PNG")[i % 2]
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, fmt)
                out.append((d, label, f"{d}_{c}_{i}.{fmt.lower()}", buf.getvalue()))
    return out


def _parquet(rows: list[tuple[str, int, str, bytes]], domain_column: str = "domain") -> bytes:
    """``rows`` as a Parquet file laid out as the Hub writes a dataset (image {bytes, path},
    domain, label with its class names in the ``huggingface`` metadata)."""
    features = {"image": {"_type": "Image"}, domain_column: {"dtype": "string", "_type": "Value"},
                "label": {"names": CLASSES, "_type": "ClassLabel"}}
    table = pa.table({
        "image": pa.array([{"bytes": b, "path": n} for _, _, n, b in rows],
                          pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        domain_column: pa.array([d for d, _, _, _ in rows], pa.string()),
        "label": pa.array([label for _, label, _, _ in rows], pa.int64()),
    }).replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _shards(rows: list[tuple[str, int, str, bytes]], **kw: str) -> dict[str, bytes]:
    """The rows shuffled into the two shards of the mirror."""
    rows = rows[:]
    random.Random(1).shuffle(rows)
    return {SHARDS[0]: _parquet(rows[::2], **kw), SHARDS[1]: _parquet(rows[1::2], **kw)}


def _zip(rows: list[tuple[str, int, str, bytes]]) -> bytes:
    """The same images in DomainBed's PACS archive layout (``kfold/<domain>/<class>/``)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for d, label, name, data in rows:
            z.writestr(f"kfold/{d}/{CLASSES[label]}/{name}", data)
    return buf.getvalue()


@dataclass
class Mirror:
    """What the server holds and how it misbehaves; the requests it received."""

    base: str
    files: dict[str, bytes]
    archive: bytes
    lfs: bool = True  # list each file's sha256 (an LFS oid), as the Hub does for Parquet
    down: bool = False  # 404 for every Hub URL
    missing: set[str] = field(default_factory=set)  # listed, but 404 for these
    drop_once: set[str] = field(default_factory=set)  # close midway through these, once
    corrupt: set[str] = field(default_factory=set)  # serve these with a byte flipped
    requests: list[tuple[str, str | None]] = field(default_factory=list)

    def listing(self) -> list[dict]:
        entries = [{"type": "directory", "path": "data/extra", "oid": "0" * 40, "size": 0},
                   {"type": "file", "path": "data/notes.txt", "oid": "1" * 40, "size": 5}]
        for path, data in self.files.items():
            entry = {"type": "file", "path": path, "oid": "2" * 40, "size": len(data)}
            if self.lfs:
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 134}
            entries.append(entry)
        return entries


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        mirror: Mirror = self.server.mirror  # set by the fixture
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        mirror.requests.append((path, self.headers.get("Range")))
        api, resolve = f"/api/datasets/{REPO}/", f"/datasets/{REPO}/resolve/{COMMIT}/"
        if path == "/original/PACS.zip":
            self._send(200, mirror.archive)
        elif mirror.down:
            self._send(404, b'{"error": "Repository not found"}')
        elif path.startswith(api + "revision/"):
            self._json({"id": REPO, "sha": COMMIT})
        elif path == f"{api}tree/{COMMIT}/data":
            self._json(mirror.listing())
        elif path.startswith(resolve) and path[len(resolve):] in set(mirror.files) - \
                mirror.missing:
            self.send_response(302)  # the Hub redirects a file to its CDN
            self.send_header("Location", "/cdn/" + path[len(resolve):])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/cdn/") and path[5:] in mirror.files:
            self._file(mirror, path[5:])
        else:
            self._send(404, b"not found")

    def _file(self, mirror: Mirror, name: str) -> None:
        data = mirror.files[name]
        if name in mirror.corrupt:
            data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
        start = int(self.headers["Range"].split("=")[1].rstrip("-")) if self.headers.get(
            "Range") else 0
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if name in mirror.drop_once:  # half the bytes, then the connection is closed
            mirror.drop_once.discard(name)
            self.wfile.write(data[start:len(data) // 2])
            return
        self.wfile.write(data[start:])

    def _json(self, value: object) -> None:
        self._send(200, json.dumps(value).encode(), "application/json")

    def _send(self, code: int, body: bytes, kind: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def made():
    """The images, the mirror's shards and the original archive, made once."""
    rows = _images()
    return rows, _shards(rows), _zip(rows)


@pytest.fixture
def mirror(made, monkeypatch):
    """A fresh mirror served on 127.0.0.1 as ``HF_ENDPOINT``; ``pacs`` downloads from it
    (its original source: the archive on the same server)."""
    _, shards, archive = made
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.mirror = Mirror(f"http://127.0.0.1:{server.server_address[1]}", dict(shards),
                           archive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", server.mirror.base)
    _use(monkeypatch, server.mirror, PACS_MIRROR)
    yield server.mirror
    server.shutdown()
    server.server_close()


def _use(monkeypatch, mirror: Mirror, pinned: HubMirror) -> None:
    """``pacs`` with ``pinned`` as its mirror (the sizes of the shards made here) and the
    original archive on the test server."""
    spec = DATASETS.get("pacs")
    pinned = dataclasses.replace(pinned, total_size=sum(map(len, mirror.files.values())))
    source = dataclasses.replace(spec.source, mirror=pinned, archives=(
        Archive(f"{mirror.base}/original/PACS.zip", "PACS.zip", size=len(mirror.archive)),))
    count = len(CLASSES) * PER_CLASS
    monkeypatch.setitem(DATASETS._entries, "pacs", dataclasses.replace(
        spec, source=source, expected=(count,) * len(DOMAINS)))


def _show(case: str, lines: list[str]) -> None:
    print(f"--- {case}")
    for line in lines:
        print(f"    {line}")


def test_resumes_after_a_dropped_connection_and_loads_as_the_folders(mirror, tmp_path):
    first = SHARDS[0]
    mirror.drop_once.add(first)
    lines: list[str] = []
    download("pacs", tmp_path / "hub", lines.append)
    _show("resume after a dropped connection", lines)
    half = len(mirror.files[first]) // 2
    assert [r for p, r in mirror.requests if p == f"/cdn/{first}"] == [None, f"bytes={half}-"]
    size = len(mirror.files[first])
    assert any(f"connection closed after {half} of {size} bytes; resuming" in line
               for line in lines)
    folder = tmp_path / "hub" / "PACS" / hub.FOLDER
    record = hub.read_record(folder)
    assert record is not None and record.commit == COMMIT
    for f in record.files:  # the final files are the listed ones, digests from the listing
        assert f.sha256_from == "listing" and file_digest(folder / f.path) == f.sha256
        assert not (folder / (f.path + ".part")).exists()
    assert [f.path for f in record.files] == list(SHARDS)

    lines = []
    download("pacs", tmp_path / "original", lines.append, source="original")
    cache = tmp_path / "cache"
    parquet = load_dataset("pacs", str(tmp_path / "hub"), 16, log=lines.append, cache=cache)
    folders = load_dataset("pacs", str(tmp_path / "original"), 16, log=lines.append)
    assert parquet.classes == folders.classes == CLASSES
    assert parquet.domain_names == folders.domain_names == list(DOMAINS)
    for a, b in zip(parquet.domains, folders.domains, strict=True):
        assert a.x.dtype == np.uint8 and a.x.shape == (len(CLASSES) * PER_CLASS, 3, 16, 16)
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y)
    assert len({a.tobytes() for d in parquet.domains for a in d.x}) == len(DOMAINS) * len(
        CLASSES) * PER_CLASS  # every image differs: equal arrays mean the same images
    assert parquet.provenance["source"] == f"hub:{REPO}@{COMMIT}"
    assert folders.provenance["source"] == f"original:{tmp_path / 'original' / 'PACS'}"
    assert parquet.provenance["fingerprint"] == folders.provenance["fingerprint"]
    again = load_dataset("pacs", str(tmp_path / "hub"), 16, log=lines.append, cache=cache)
    assert again.provenance == parquet.provenance  # from the cache, as raydg run reads it
    _show("identical images from both paths", [
        *lines, f"{len(DOMAINS)} domains x {len(CLASSES) * PER_CLASS} images: uint8 arrays "
        f"equal; fingerprint {parquet.provenance['fingerprint']} from both"])


def test_a_corrupt_file_is_refused_in_one_line(mirror, tmp_path):
    mirror.corrupt.add(SHARDS[1])
    runner = CliRunner()
    args = ["data", "download", "pacs", "--source", "hub", "--data-root", str(tmp_path)]
    result = runner.invoke(cli, args)
    _show("corrupt file refused", result.output.splitlines())
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("raydg: error:")]
    bad = tmp_path / "PACS" / hub.FOLDER / SHARDS[1]
    assert len(errors) == 1 and f"{bad}.part is corrupt: expected sha256" in errors[0]
    assert not bad.exists() and not Path(f"{bad}.part").exists()
    mirror.corrupt.clear()
    fixed = runner.invoke(cli, args)
    assert fixed.exit_code == 0, fixed.output
    assert f"{tmp_path / 'PACS' / hub.FOLDER / SHARDS[0]}: already downloaded" in fixed.output
    assert "pacs: source hub:" in fixed.output and not (tmp_path / "PACS" / "photo").exists()


@pytest.mark.parametrize("what", ["the mirror", "one file"])
def test_falls_back_to_the_original_source_on_404(mirror, what, tmp_path):
    if what == "the mirror":
        mirror.down = True
    else:
        mirror.missing.add(SHARDS[1])
    lines: list[str] = []
    download("pacs", tmp_path, lines.append)
    _show(f"fallback on 404 ({what})", lines)
    failed = "cannot read" if what == "the mirror" else "cannot download"
    assert any(f"the Hub mirror failed: {failed}" in line and "HTTP 404" in line
               for line in lines)
    assert "pacs: falling back to the original source" in lines
    partial = [hub.FOLDER] if what == "one file" else []  # the extracted folders join it
    assert sorted(p.name for p in (tmp_path / "PACS").iterdir()) == sorted([*DOMAINS, *partial])
    assert load_dataset("pacs", str(tmp_path), 16).provenance["source"].startswith("original:")


def test_a_branch_and_digests_are_recorded_at_the_first_download(mirror, monkeypatch,
                                                                  tmp_path):
    mirror.lfs = False  # the listing gives no sha256: the first download's are recorded
    _use(monkeypatch, mirror, dataclasses.replace(PACS_MIRROR, revision="main"))
    lines: list[str] = []
    download("pacs", tmp_path, lines.append, source="hub")
    _show("branch resolved, digests recorded at the first download", lines)
    assert f"{REPO}: revision main is commit {COMMIT}; recorded" in lines
    record = hub.read_record(tmp_path / "PACS" / hub.FOLDER)
    assert record is not None and (record.revision, record.commit) == ("main", COMMIT)
    assert {f.sha256_from for f in record.files} == {"first download"}
    asked = len(mirror.requests)
    download("pacs", tmp_path, lines.append, source="hub")
    assert len(mirror.requests) == asked  # checked against the record, the Hub not asked
    shard = tmp_path / "PACS" / hub.FOLDER / SHARDS[0]
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = check("pacs", tmp_path, lambda _: None)
    assert problems[0].startswith(f"{shard}: sha256 ") and "(from the first download)" in \
        problems[0]


@pytest.mark.parametrize("change, message", [
    ("column", "not a layout raydg reads (expected columns image {bytes, path}, domain"),
    ("domains", "domain(s) ['Art', 'Photo'] are not raydg's"),
])
def test_an_unknown_layout_is_refused_in_one_line(mirror, made, monkeypatch, change, message,
                                                  tmp_path):
    rows = made[0]
    if change == "domains":
        names = {"art_painting": "Art", "photo": "Photo"}
        rows = [(names.get(d, d), *rest) for d, *rest in rows]
    mirror.files = _shards(rows, **({"domain_column": "env"} if change == "column" else {}))
    _use(monkeypatch, mirror, PACS_MIRROR)  # the new files' total size
    result = CliRunner().invoke(cli, ["data", "download", "pacs", "--source", "hub",
                                      "--data-root", str(tmp_path)])
    errors = [line for line in result.output.splitlines() if line.startswith("raydg: error:")]
    _show(f"unknown layout refused ({change})", errors)
    assert result.exit_code == 2 and len(errors) == 1 and message in errors[0]


def test_source_choice(tmp_path):
    runner = CliRunner()
    none = runner.invoke(cli, ["data", "download", "vlcs", "--source", "hub", "--data-root",
                               str(tmp_path)])
    assert none.exit_code == 2 and "vlcs has no Hub mirror; use --source original" in none.output
    (tmp_path / "PACS" / "photo").mkdir(parents=True)
    first = runner.invoke(cli, ["data", "download", "pacs", "--source", "hub", "--data-root",
                                str(tmp_path)])
    assert first.exit_code == 2 and "are read before a Hub copy" in first.output
