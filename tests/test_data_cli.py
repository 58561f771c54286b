"""``raydg data download|check`` end to end, with a PACS-shaped zip served from 127.0.0.1."""

from __future__ import annotations

import dataclasses
import functools
import http.server
import socket
import threading
import zipfile

import pytest
from click.testing import CliRunner
from PIL import Image

from raydg.cli import cli
from raydg.datasets import DATASETS, DataSource
from raydg.download import Archive

DOMAINS = ("art_painting", "cartoon", "photo", "sketch")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A zip laid out like DomainBed's PACS download (``kfold/<domain>/<class>/``), served."""
    folder = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(folder / "PACS.zip", "w") as z:
        for d in DOMAINS:
            for c in ("dog", "horse"):
                img = folder / "img.png"
                Image.new("RGB", (6, 6), (len(d), len(c), 0)).save(img)
                z.write(img, f"kfold/{d}/{c}/0.png")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/PACS.zip", (folder / "PACS.zip")
    server.shutdown()
    server.server_close()


def _use_source(monkeypatch, url: str, size: int | None) -> None:
    spec = DATASETS.get("pacs")
    local = DataSource((Archive(url, "PACS.zip", size=size),), renames=(("kfold", "PACS"),))
    monkeypatch.setitem(DATASETS._entries, "pacs",
                        dataclasses.replace(spec, source=local, expected=(2, 2, 2, 2)))


def test_download_extracts_arranges_and_checks(served, monkeypatch, tmp_path):
    url, archive = served
    _use_source(monkeypatch, url, archive.stat().st_size)
    runner = CliRunner()
    result = runner.invoke(cli, ["data", "download", "pacs", "--data-root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "PACS").iterdir()) == list(DOMAINS)
    assert "pacs/sketch: 2 readable images" in result.output
    again = runner.invoke(cli, ["data", "download", "pacs", "--data-root", str(tmp_path)])
    assert again.exit_code == 0 and "already downloaded" in again.output

    ok = runner.invoke(cli, ["data", "check", "pacs", "--data-root", str(tmp_path)])
    assert ok.exit_code == 0 and ok.output.strip().endswith("pacs: OK")
    bad = tmp_path / "PACS" / "photo" / "dog" / "0.png"
    bad.write_bytes(b"\x89PNG broken")
    (tmp_path / "PACS" / "cartoon" / "horse" / "0.png").unlink()
    broken = runner.invoke(cli, ["data", "check", "pacs", "--data-root", str(tmp_path)])
    assert broken.exit_code == 1
    assert f"problem: unreadable: {bad}" in broken.output
    assert "problem: pacs/cartoon: 1 images, expected 2" in broken.output
    assert "problem: pacs/photo:" not in broken.output  # unreadable is counted, not missing


def test_check_names_missing_domains_and_download_fails_offline(monkeypatch, tmp_path):
    (tmp_path / "PACS" / "photo" / "dog").mkdir(parents=True)
    runner = CliRunner()
    result = runner.invoke(cli, ["data", "check", "pacs", "--data-root", str(tmp_path)])
    assert result.exit_code == 1
    for d in ("art_painting", "cartoon", "sketch"):
        assert d in result.output
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _use_source(monkeypatch, f"http://127.0.0.1:{port}/PACS.zip", None)
    offline = runner.invoke(cli, ["data", "download", "pacs", "--data-root", str(tmp_path)])
    assert offline.exit_code == 2
    errors = [line for line in offline.output.splitlines() if line.startswith("raydg: error:")]
    assert len(errors) == 1 and f"127.0.0.1:{port}" in errors[0]


def test_datasets_without_a_public_source_say_so(tmp_path):
    result = CliRunner().invoke(cli, ["data", "download", "office-caltech-home",
                                      "--data-root", str(tmp_path)])
    assert result.exit_code == 2 and "no public download is registered" in result.output
