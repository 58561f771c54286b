"""Amplitude mixing against independent expectations: Eq. (1)-(3) of FedDG/ELCFS recomputed with
numpy's FFT on small images, the draws, the ledger's bytes, and ``--augment ampmix``."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.methods import METHODS, ClientContext, method_class
from raydg.methods.ampmix import (
    BANK,
    AmpMixOptions,
    Mixer,
    draw_sources,
    low_freq_amplitude,
    mix_amplitude,
)
from raydg.partition import ClientData
from tests.conftest import tiny_config


def by_hand(image: np.ndarray, other: np.ndarray, lam: float, beta: float) -> np.ndarray:
    """Eq. (2)-(3) in numpy: M from the integer frequencies |u|, |v| <= floor(beta min(H, W))."""
    h, w = image.shape[-2:]
    b = int(np.floor(min(h, w) * beta))
    u, v = np.fft.fftfreq(h, 1 / h), np.fft.fftfreq(w, 1 / w)
    mask = (np.abs(u)[:, None] <= b) & (np.abs(v)[None, :] <= b)
    f = np.fft.fft2(image)
    amplitude = np.where(mask, (1 - lam) * np.abs(f) + lam * np.abs(np.fft.fft2(other)),
                         np.abs(f))
    return amplitude * np.exp(1j * np.angle(f))  # the expected spectrum of the result


def _mix(image: np.ndarray, other: np.ndarray, lam: float, beta: float) -> np.ndarray:
    window = low_freq_amplitude(torch.from_numpy(other)[None], beta)
    return mix_amplitude(torch.from_numpy(image)[None], window,
                         torch.tensor([lam], dtype=torch.float64), beta)[0].numpy()


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 8, 8), (3, 7, 9)])
@pytest.mark.parametrize("beta", [0.25, 0.5])
def test_mixing_equals_eq_2_and_3_by_hand(shape, beta):
    rng = np.random.default_rng(0)
    image, other = rng.uniform(60, 190, (2, *shape))
    expected = by_hand(image, other, 0.3, beta)
    got = np.fft.fft2(_mix(image, other, 0.3, beta))
    np.testing.assert_allclose(np.abs(got), np.abs(expected), rtol=1e-9, atol=1e-8)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-8)  # the local phase
    changed = ~np.isclose(np.abs(expected), np.abs(np.fft.fft2(image)))
    b = int(np.floor(min(shape[1:]) * beta))
    assert changed.sum() > shape[0]  # more than the DC terms moved
    assert all(changed[:, i, j].sum() == 0 for i in range(shape[1]) for j in range(shape[2])
               if min(i, shape[1] - i) > b or min(j, shape[2] - j) > b)  # nothing off M


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 7, 7)])
def test_lambda_zero_returns_the_image_and_one_takes_the_other_amplitude(shape):
    rng = np.random.default_rng(1)
    image, other = rng.uniform(60, 190, (2, *shape))
    np.testing.assert_allclose(_mix(image, other, 0.0, 0.25), image, atol=1e-9)
    full = np.fft.fft2(_mix(image, other, 1.0, 0.5))  # beta 0.5: all of a square spectrum
    np.testing.assert_allclose(np.abs(full), np.abs(np.fft.fft2(other)), rtol=1e-9, atol=1e-8)


def test_the_shared_window_is_the_centred_low_frequency_amplitude():
    image = np.random.default_rng(2).uniform(0, 255, (2, 3, 10, 10))
    window = low_freq_amplitude(torch.from_numpy(image), 0.2).numpy()  # b = 2
    assert window.shape == (2, 3, 5, 5)
    amplitude = np.abs(np.fft.fft2(image))
    for i in range(5):
        for j in range(5):  # window index (i, j) is frequency (i - 2, j - 2)
            np.testing.assert_allclose(window[:, :, i, j], amplitude[:, :, i - 2, j - 2])


def test_draws_never_pick_the_own_client_and_are_uniform_over_the_others():
    rng = np.random.default_rng(3)
    sizes = {0: 50, 1: 3, 2: 4, 3: 0}  # client 3 has no spectra
    clients, idx = draw_sources(rng, sizes, own=0, n=4000)
    assert set(clients) == {1, 2}
    assert np.mean(clients == 1) == pytest.approx(0.5, abs=0.03)  # by client, not by spectrum
    assert all(0 <= i < sizes[c] for c, i in zip(clients, idx, strict=True))
    assert {(c, i) for c, i in zip(clients, idx, strict=True)} == {
        (c, i) for c in (1, 2) for i in range(sizes[c])}


def _flat_bank(levels: dict[int, float], shape=(1, 8, 8), beta=0.25):
    """Each client's spectra: those of flat images, so a mixed image's mean names its source."""
    return {c: low_freq_amplitude(torch.full((3, *shape), v, dtype=torch.float64), beta)
            .float().numpy() for c, v in levels.items()}


def test_a_client_only_receives_other_clients_amplitudes():
    levels = {0: 50.0, 1: 100.0, 2: 150.0, 3: 200.0}
    checker = 10.0 * (-1.0) ** np.add.outer(np.arange(8), np.arange(8))  # Nyquist: off M
    x = np.broadcast_to(100 + checker, (64, 1, 8, 8)).astype(np.uint8)
    options = AmpMixOptions(beta=0.25, lambda_low=1.0, lambda_high=1.0, prob=1.0)
    mixer = Mixer(lambda b: b, _flat_bank(levels), 1, options, np.random.default_rng(0),
                  torch.device("cpu"))
    out = mixer.mix(x).astype(np.float64)
    means = out.mean(axis=(1, 2, 3))
    assert set(np.round(means)) == {50.0, 150.0, 200.0}  # never client 1's own 100
    np.testing.assert_allclose(out - means[:, None, None, None], np.broadcast_to(
        checker, out.shape), atol=0.5)  # the off-M content and the phase are the image's


def test_prob_zero_and_lambda_zero_leave_the_batch_as_it_was():
    x = np.random.default_rng(4).integers(0, 256, (16, 3, 8, 8), dtype=np.uint8)
    bank = _flat_bank({0: 30.0, 1: 220.0}, (3, 8, 8))
    for options in (AmpMixOptions(beta=0.25, prob=0.0),
                    AmpMixOptions(beta=0.25, prob=1.0, lambda_high=0.0)):
        mixer = Mixer(lambda b: b, bank, 0, options, np.random.default_rng(0),
                      torch.device("cpu"))
        np.testing.assert_array_equal(mixer.mix(x), x)
    mixer = Mixer(lambda b: b, bank, 0, AmpMixOptions(beta=0.25, prob=0.5),
                  np.random.default_rng(0), torch.device("cpu"))
    kept = [np.array_equal(a, b) for a, b in zip(mixer.mix(x), x, strict=True)]
    assert 0 < sum(kept) < 16


def _context(method, seed: int) -> ClientContext:
    cfg = tiny_config()
    x = np.random.default_rng(5).integers(0, 256, (12, 3, 16, 16), dtype=np.uint8)
    data = ClientData(0, "d", x, np.zeros(12, dtype=np.int64), x[:1], np.zeros(1, np.int64))
    ctx = ClientContext(
        client_id=0, round=1, data=data, model=nn.Linear(2, 2), config=cfg,
        device=torch.device("cpu"), global_state={},
        memory={BANK: _flat_bank({0: 30.0, 1: 120.0, 2: 220.0}, (3, 16, 16), 0.1)},
        generator=torch.Generator().manual_seed(seed), inputs=None,
        train_inputs=lambda b: torch.from_numpy(b), evaluate=None)
    method.start_round(ctx)
    return ctx


def test_the_same_seed_gives_the_same_mixed_batch():
    cls = method_class("fedprox", "ampmix")
    method = cls(cls.parse_options({"prob": 1.0}))
    x = _context(method, 0).data.train_x
    first, again = (_context(method, 0).train_inputs(x) for _ in range(2))
    assert torch.equal(first, again) and not torch.equal(first, torch.from_numpy(x))
    assert not torch.equal(first, _context(method, 1).train_inputs(x))
    assert "anchor" in _context(method, 0).scratch  # FedProx's own start_round ran


def test_training_without_a_bank_fails_clearly_and_options_are_checked():
    method = METHODS.get("am")()
    ctx = _context(method, 0)
    ctx.memory.clear()
    with pytest.raises(RaydgError, match="no amplitude bank"):
        method.start_round(ctx)
    for bad in ({"beta": 0.6}, {"prob": 1.5}, {"lambda_low": 0.8, "lambda_high": 0.2},
                {"bank_size": -1}):
        with pytest.raises(RaydgError, match="ampmix"):
            METHODS.get("ampmix").parse_options(bad)
    opts = method_class("fedprox", "ampmix").parse_options({"mu": 0.5, "beta": 0.2})
    assert (opts.mu, opts.beta, opts.prob, opts.bank_size) == (0.5, 0.2, 0.5, 0)


def _run(cfg):
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    return sim, sim.run()


def _assert_ledger_holds_the_windows(sim, result, channels: int, bank_size: int) -> None:
    """Up: each client's float32 windows (C x (2b+1)^2, b = floor(0.1 x 16) = 1); down: the
    whole bank to every client; nothing else in the setup phase carries bytes."""
    per_image = channels * 3 * 3 * 4
    banked = {c: bank_size or n for c, n in sim.num_samples.items()}
    setup = [r for r in result.tables["ledger"] if r["round"] == 0]
    assert {r["kind"] for r in setup} == {"request", "amplitude_spectra", "amplitude_bank"}
    ups = {r["client"]: r["bytes"] for r in setup if r["kind"] == "amplitude_spectra"}
    assert ups == {c: banked[c] * per_image for c in sim.client_ids}
    downs = [r for r in setup if r["kind"] == "amplitude_bank" and r["direction"] == "down"]
    assert len(downs) == len(sim.client_ids)
    assert all(r["bytes"] == sum(ups.values()) for r in downs)
    empty = [r for r in setup if r["kind"] == "request"
             or (r["kind"] == "amplitude_bank" and r["direction"] == "up")]
    assert len(empty) == 2 * len(sim.client_ids) and all(r["bytes"] == 0 for r in empty)
    assert np.isfinite(result.history[-1]["train_loss"])


def test_augment_ampmix_with_fedbn_on_digits_style(warm_actors):
    composed = method_class("fedbn", "ampmix")
    assert composed.__mro__[1:3] == (METHODS.get("ampmix"), METHODS.get("fedbn"))
    cfg = tiny_config(method="fedbn", augment="ampmix", rounds=1, local_steps=2, actors=1)
    assert cfg.image_size == 16
    sim, result = _run(cfg)
    assert result.method == "fedbn+ampmix"
    _assert_ledger_holds_the_windows(sim, result, channels=3, bank_size=0)
    assert any(r["round"] == 1 and r["kind"] == "parameters" for r in result.tables["ledger"])
    bn = {k for k in result.global_state if "running_mean" in k}
    assert bn and bn <= sim.local_keys  # FedBN's local statistics are still in place


def test_ampmix_on_digits_rot_banks_a_subsample(warm_actors):
    cfg = tiny_config(dataset="digits-rot", target="M75", method="am", rounds=1,
                      local_steps=2, actors=1, options={"bank_size": 10})
    sim, result = _run(cfg)
    assert result.method == "ampmix [bank_size=10]" and len(sim.client_ids) == 5
    _assert_ledger_holds_the_windows(sim, result, channels=1, bank_size=10)
