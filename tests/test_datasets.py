"""Embedded digits benchmarks and the DomainBed-layout image-folder loader."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from scipy.ndimage import rotate
from sklearn.datasets import load_digits

from raydg.datasets import load_dataset
from raydg.errors import RaydgError


def test_digits_rot_follows_rotated_mnist_protocol():
    data = load_dataset("digits-rot", None, None)
    assert data.domain_names == ["M0", "M15", "M30", "M45", "M60", "M75"]
    for d in data.domains:
        assert d.x.shape == (1000, 1, 16, 16) and d.x.dtype == np.uint8
        np.testing.assert_array_equal(np.bincount(d.y), [100] * 10)
        np.testing.assert_array_equal(d.y, data.domains[0].y)  # the same images, rotated
    # M0's images are sklearn digits: each M0 image upsampled from an original 8x8 digit
    digits = load_digits()
    small = data.domain("M0").x[:, 0].reshape(1000, 8, 2, 8, 2).astype(float).mean(axis=(2, 4))
    dist = ((small[:, None] / 255.0 - digits.images[None] / 16.0) ** 2).sum(axis=(2, 3))
    nearest = dist.argmin(axis=1)
    np.testing.assert_array_equal(digits.target[nearest], data.domain("M0").y)
    assert len(set(nearest.tolist())) >= 990  # sklearn digits holds a few near-duplicates
    # M90-style check of direction: rotating M0 clockwise by 45 degrees is close to M45
    m0 = data.domain("M0").x[:, 0].astype(float)
    clockwise = rotate(m0, -45, axes=(2, 1), reshape=False, order=1)
    counter = rotate(m0, 45, axes=(2, 1), reshape=False, order=1)
    m45 = data.domain("M45").x[:, 0].astype(float)
    assert np.abs(clockwise - m45).mean() < 0.5 * np.abs(counter - m45).mean()


def test_embedded_digits_are_scikit_learns_read_without_importing_it():
    code = ("import sys; from raydg.datasets.digits import sklearn_digits; "
            "x, y = sklearn_digits(); "
            "print(x.shape, int(x.max()), y.sum(), 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    digits = load_digits()
    assert out.stdout.split() == ["(1797,", "8,", "8)", "16", str(digits.target.sum()), "False"]
    from raydg.datasets.digits import sklearn_digits

    pixels, labels = sklearn_digits()
    np.testing.assert_array_equal(pixels, digits.images)
    np.testing.assert_array_equal(labels, digits.target)


def test_digits_style_domains_are_disjoint_and_balanced():
    data = load_dataset("digits-style", None, None)
    assert data.domain_names == ["plain", "colour-inverted", "sketch", "texture"]
    sizes = [len(d) for d in data.domains]
    assert sum(sizes) == 1797 and max(sizes) - min(sizes) <= 10
    for d in data.domains:
        assert d.x.shape[1:] == (3, 16, 16)
        assert np.bincount(d.y, minlength=10).min() >= 40
    # the styles really differ: mean brightness of plain (dark paper) vs sketch (white paper)
    assert data.domain("plain").x.mean() < 100 < data.domain("sketch").x.mean()
    again = load_dataset("digits-style", None, None)
    for a, b in zip(data.domains, again.domains, strict=True):
        np.testing.assert_array_equal(a.x, b.x)


def test_generated_styles_are_the_extremes_they_claim_at_16_and_32_px():
    from raydg.datasets.generated import KINDS, register_family

    data = load_dataset("digits-gen", None, None)
    assert data.domain_names == list(KINDS)
    assert sum(len(d) for d in data.domains) == 1797
    assert all(np.bincount(d.y, minlength=10).min() >= 30 for d in data.domains)
    pixels = {d.name: d.x.astype(float).reshape(len(d), 3, -1) / 255 for d in data.domains}
    std = pixels["low-contrast"].reshape(len(data.domain("low-contrast")), -1).std(axis=1)
    assert std.min() < 0.02 and np.median(std) < 0.06  # a pixel std of a few percent
    flat = data.domain("flat").x.astype(int)
    assert (flat[:, :, 0, 0] == flat[:, :, -1, -1]).all()  # a uniform ground at the corners
    channel_std = pixels["coloured"].std(axis=2)
    assert ((channel_std < 1e-9).sum(axis=1) == 2).all()  # ink differs in one channel only
    inverted = pixels["inverted"]
    assert (inverted.mean(axis=(1, 2)) > 0.5).mean() > 0.9  # mostly light paper
    # the grating (2-3 px): its share of the image's power above 0.3 cycles per pixel is more
    # than twice any other style's
    high = {d.name: _high_frequency_share(d.x) for d in data.domains}
    assert all(high["high-frequency"] > 2 * v for k, v in high.items() if k != "high-frequency")
    big = load_dataset("digits-gen", None, 32)
    assert big.domains[0].x.shape[1:] == (3, 32, 32)
    assert [d.y.tolist() for d in big.domains] == [d.y.tolist() for d in data.domains]
    other = load_dataset(register_family(1), None, None)
    assert register_family(1) == "digits-gen-1"
    assert not np.array_equal(other.domains[0].x, data.domains[0].x)  # other draws
    again = load_dataset("digits-gen", None, None)
    for a, b in zip(data.domains, again.domains, strict=True):
        np.testing.assert_array_equal(a.x, b.x)


def _high_frequency_share(x: np.ndarray) -> float:
    """Mean over images of the share of (grey, mean-free) power above 0.3 cycles per pixel."""
    grey = x.astype(float).mean(axis=1)
    power = np.abs(np.fft.fft2(grey - grey.mean(axis=(1, 2), keepdims=True))) ** 2
    f = np.fft.fftfreq(grey.shape[1])
    high = np.hypot(*np.meshgrid(f, f, indexing="ij")) > 0.3
    return float((power[:, high].sum(axis=1) / power.sum(axis=(1, 2))).mean())


def _write_tree(root, domains, classes, per_class=2, empty=()):
    for d in domains:
        for c in classes:
            folder = root / "PACS" / d / c
            folder.mkdir(parents=True)
            if d in empty:
                continue
            for i in range(per_class):
                colour = (40 * i, 100, 200) if c == classes[0] else (200, 50, 40 * i)
                Image.new("RGB", (20 + i, 24), colour).save(folder / f"{i}.png")


PACS = ("art_painting", "cartoon", "photo", "sketch")


def test_image_folder_loads_domainbed_layout(tmp_path):
    _write_tree(tmp_path, PACS, ["dog", "horse"], per_class=3)
    data = load_dataset("pacs", str(tmp_path), 8)
    assert data.classes == ["dog", "horse"] and data.domain_names == list(PACS)
    for d in data.domains:
        assert d.x.shape == (6, 3, 8, 8)
        np.testing.assert_array_equal(d.y, [0, 0, 0, 1, 1, 1])
    # pixel values survive: image 0 of class 'dog' is the solid colour (0, 100, 200)
    np.testing.assert_array_equal(data.domains[0].x[0, :, 4, 4], [0, 100, 200])


def test_image_folder_errors(tmp_path, monkeypatch):
    monkeypatch.delenv("RAYDG_DATA_ROOT", raising=False)
    with pytest.raises(RaydgError, match="--data-root"):
        load_dataset("pacs", None, 8)
    with pytest.raises(RaydgError, match="does not exist"):
        load_dataset("pacs", str(tmp_path / "nowhere"), 8)
    _write_tree(tmp_path, PACS[:3], ["dog"])
    with pytest.raises(RaydgError, match="missing domain"):
        load_dataset("pacs", str(tmp_path), 8)
    (tmp_path / "PACS" / "sketch" / "dog").mkdir(parents=True)
    with pytest.raises(RaydgError, match="'sketch' has no images"):
        load_dataset("pacs", str(tmp_path), 8)
    (tmp_path / "PACS" / "sketch" / "dog" / "bad.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(RaydgError, match=r"bad\.jpg"):
        load_dataset("pacs", str(tmp_path), 8)


def test_unreadable_images_can_be_skipped_and_counted(tmp_path):
    _write_tree(tmp_path, PACS, ["dog", "horse"], per_class=3)
    bad = tmp_path / "PACS" / "cartoon" / "dog" / "9.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 truncated jpeg")
    with pytest.raises(RaydgError, match=r"cartoon/dog/9\.jpg.*--skip-bad-images"):
        load_dataset("pacs", str(tmp_path), 8)
    said: list[str] = []
    data = load_dataset("pacs", str(tmp_path), 8, skip_bad=True, log=said.append)
    assert len(data.domain("cartoon")) == 6 and len(data.domain("photo")) == 6
    np.testing.assert_array_equal(data.domain("cartoon").y, [0, 0, 0, 1, 1, 1])
    assert said == ["pacs/cartoon: skipped 1 unreadable image(s) of 7"]


def test_decoded_images_are_cached_and_the_cache_follows_the_files(tmp_path, monkeypatch):
    from raydg.datasets import folders

    _write_tree(tmp_path / "data", PACS, ["dog", "horse"], per_class=2)
    cache, said = tmp_path / "cache", []
    first = load_dataset("pacs", str(tmp_path / "data"), 8, log=said.append, cache=cache)
    assert said[-1].startswith("pacs: cached the decoded images")

    def no_decoding(*_args):
        raise AssertionError("decoded an image although it is cached")

    monkeypatch.setattr(folders, "read_image", no_decoding)
    again = load_dataset("pacs", str(tmp_path / "data"), 8, log=said.append, cache=cache)
    assert said[-1].startswith("pacs: decoded images from the cache")
    assert isinstance(again.domains[0].x, np.memmap)
    assert again.classes == first.classes and again.domain_names == first.domain_names
    for a, b in zip(first.domains, again.domains, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
    Image.new("RGB", (9, 9), (1, 2, 3)).save(tmp_path / "data/PACS/photo/dog/new.png")
    with pytest.raises(AssertionError, match="decoded an image"):  # a new file: a new entry
        load_dataset("pacs", str(tmp_path / "data"), 8, log=said.append, cache=cache)
    monkeypatch.undo()
    assert len(load_dataset("pacs", str(tmp_path / "data"), 8, cache=cache).domain("photo")) == 5
    assert len(list(cache.iterdir())) == 2


def test_domains_must_share_their_class_folders(tmp_path):
    _write_tree(tmp_path, PACS, ["dog"])
    (tmp_path / "PACS" / "photo" / "horse").mkdir()
    with pytest.raises(RaydgError, match=r"class folders missing: \{'art_painting': \['horse'\]"):
        load_dataset("pacs", str(tmp_path), 8)


def test_office_caltech_home_merges_the_common_classes(tmp_path):
    def tree(base, domains, classes):
        for d in domains:
            for c in classes:
                (tmp_path / base / d / c).mkdir(parents=True)
                Image.new("RGB", (5, 5), (len(c), 0, 0)).save(tmp_path / base / d / c / "0.jpg")

    tree("office_caltech_10", ["amazon", "webcam", "caltech", "dslr"],
         ["back_pack", "headphones", "laptop_computer", "mug"])
    tree("office_home", ["Art", "Clipart", "Product", "Real World"],
         ["Backpack", "Laptop", "Mug", "Webcam"])
    data = load_dataset("office-caltech-home", str(tmp_path), 8)
    assert data.domain_names == ["Amazon", "Webcam", "Caltech", "Art", "Clipart", "Product",
                                 "Real World"]
    assert data.classes == ["backpack", "laptop", "mug"]
    for d in data.domains:
        np.testing.assert_array_equal(d.y, [0, 1, 2])


def test_an_empty_class_folder_is_refused(tmp_path):
    _write_tree(tmp_path, PACS, ["dog", "horse"])
    for image in (tmp_path / "PACS" / "photo" / "horse").iterdir():
        image.unlink()
    with pytest.raises(RaydgError, match=r"domain 'photo' has no images of class\(es\) "
                                         r"\['horse'\]"):
        load_dataset("pacs", str(tmp_path), 8)


def test_cache_writes_leave_no_temporary_folders(tmp_path, monkeypatch):
    from raydg.datasets import cache as cache_mod

    _write_tree(tmp_path / "data", PACS, ["dog"])
    cache = tmp_path / "cache"
    orphan = cache / ".writing-999999999-abc"  # a writer that was killed (no such pid)
    orphan.mkdir(parents=True)
    mine = cache / f".writing-{os.getpid()}-live"  # a writer still running
    mine.mkdir()

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_mod.np, "save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        load_dataset("pacs", str(tmp_path / "data"), 8, cache=cache)
    assert sorted(p.name for p in cache.iterdir()) == [mine.name]  # orphan and own one gone


def test_inputs_are_normalised_per_channel_from_floats_or_tensors_alike():
    """``to_inputs``: (x / 255 - mean) / std per channel, in float32 as numpy computes it; the
    constants as floats or as float32 tensors (a runtime keeps them on its device) give the
    same bits."""
    import torch

    from raydg.datasets import to_inputs

    x = np.random.default_rng(0).integers(0, 256, (4, 3, 5, 5), dtype=np.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    m, s = (np.array(v, dtype=np.float32).reshape(1, 3, 1, 1) for v in (mean, std))
    expected = (x.astype(np.float32) / np.float32(255) - m) / s
    floats = to_inputs(x, mean, std)
    tensors = to_inputs(torch.from_numpy(x), torch.tensor(mean), torch.tensor(std))
    assert floats.dtype == torch.float32 and torch.equal(floats, tensors)
    np.testing.assert_allclose(floats.numpy(), expected, rtol=1e-6, atol=1e-6)
