"""The offline pretrained start: glyph data disjoint from the digits, central pretraining,
caching as a safe state dict, and federations starting from it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import raydg.pretrain as pretrain
from raydg.models import ModelSpec, build_model
from raydg.pretrain import LETTERS, glyph_weights, render_glyphs

SMALL = {**pretrain.GLYPH_RECIPE, "per_class": 150, "epochs": 10}


@pytest.fixture
def small_recipe(monkeypatch):
    monkeypatch.setattr(pretrain, "GLYPH_RECIPE", SMALL)


def test_glyphs_are_letters_that_do_not_look_like_digits():
    assert not set(LETTERS) & set("BDGIOQSZ0123456789")
    x, y = render_glyphs(5, 3, 16, np.random.default_rng(0))
    assert x.shape == (5 * len(LETTERS), 3, 16, 16) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [5] * len(LETTERS)
    again, _ = render_glyphs(5, 3, 16, np.random.default_rng(0))
    np.testing.assert_array_equal(x, again)  # seeded
    # ink and plain paper are at least 0.4 apart in every channel: real contrast
    half = np.zeros((16, 16), np.float32)
    half[:, :8] = 1.0
    rng = np.random.default_rng(1)
    for _ in range(50):
        image = pretrain._paint(half, 3, rng).astype(float) / 255
        if image[:, :, 8:].std(axis=(1, 2)).max() == 0:  # a plain background
            assert np.abs(image[:, 0, 0] - image[:, 0, 15]).min() >= 0.4 - 1 / 255
    gray, _ = render_glyphs(2, 1, 16, np.random.default_rng(0))
    assert gray.shape == (2 * len(LETTERS), 1, 16, 16)


@pytest.mark.slow
def test_pretraining_learns_the_letters_and_is_deterministic(small_recipe):
    state, accuracy = pretrain.pretrain_glyphs("cnn", 3, 16, (0.5,) * 3, (0.5,) * 3)
    assert accuracy > 3 / len(LETTERS)  # well above chance on held-out glyphs
    again, same = pretrain.pretrain_glyphs("cnn", 3, 16, (0.5,) * 3, (0.5,) * 3)
    assert same == accuracy and state.keys() == again.keys()
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert not any(k.startswith("classifier") for k in state)  # the letters' head is dropped
    fresh = build_model(ModelSpec("cnn", 3, 16, 16)).features.state_dict()
    assert any(not torch.equal(state[k], fresh[k]) for k in state if "weight" in k)


def test_glyph_weights_are_cached_and_start_the_backbone(tmp_path, small_recipe, monkeypatch):
    lines: list[str] = []
    state = glyph_weights("cnn", 3, 16, (0.5,) * 3, (0.5,) * 3, tmp_path, lines.append)
    (path,) = (tmp_path / "pretrained").glob("glyphs-cnn-3x16-*.pt")
    assert any("held-out glyphs" in line for line in lines)

    def no_training(*_a, **_k):
        raise AssertionError("the cached weights must be reused")

    monkeypatch.setattr(pretrain, "pretrain_glyphs", no_training)
    cached = glyph_weights("cnn", 3, 16, (0.5,) * 3, (0.5,) * 3, tmp_path, lines.append)
    assert all(torch.equal(state[k], cached[k]) for k in state)
    assert torch.load(path, weights_only=True).keys() == state.keys()  # a plain state dict
    with pytest.raises(AssertionError, match="reused"):  # another image shape: another file
        glyph_weights("cnn", 1, 16, (0.5,), (0.5,), tmp_path, lines.append)
    model = build_model(dataclasses.replace(ModelSpec("cnn", 3, 10, 16), weights=state))
    assert all(torch.equal(model.features.state_dict()[k], state[k]) for k in state)
    assert model.classifier.out_features == 10  # a new head for the digits


def test_neutral_glyphs_have_light_ink_on_plain_paper(small_recipe, tmp_path):
    """glyphs-neutral: no polarity flips (the ink is the lightest pixel of every image, the
    paper uniform), and a backbone cached under its own name."""
    x, y = render_glyphs(5, 3, 16, np.random.default_rng(0), neutral=True)
    assert np.bincount(y).tolist() == [5] * len(LETTERS)
    corner = x[:, :, 0, 0].astype(int)  # paper
    assert np.all(x.reshape(len(x), 3, -1).max(axis=2) > corner)  # lighter, in every channel
    # nothing darker than the paper: no inverted ink, and no stripes or noise (both dip below)
    assert np.all(x.reshape(len(x), 3, -1).min(axis=2) == corner)
    flipped, _ = render_glyphs(5, 3, 16, np.random.default_rng(0))
    assert not np.all(flipped.reshape(len(x), 3, -1).min(axis=2) == flipped[:, :, 0, 0])
    glyph_weights("cnn", 3, 16, (0.5,) * 3, (0.5,) * 3, tmp_path, lambda _: None,
                  "glyphs-neutral")
    assert [p.name.split("-cnn")[0] for p in (tmp_path / "pretrained").glob("*.pt")] == [
        "glyphs-neutral"]


def test_the_engine_loads_no_weights_it_is_not_given():
    """A pretrained start is the caller's to load (the experiment does, once, before Ray):
    the engine refuses to guess it, before any actor starts."""
    from raydg.api import simulation
    from raydg.config import RunConfig
    from raydg.datasets import load_dataset
    from raydg.errors import RaydgError
    from raydg.resolve import resolve

    cfg = resolve(RunConfig(dataset="digits-style", target="sketch", weights="glyphs"))
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    with pytest.raises(RaydgError, match="cnn starts from glyphs weights: pass them"):
        simulation(cfg, data, log=lambda _: None)
