"""CSAC against independent numpy computations of its Eq. (3)-(9) and its protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raydg import state
from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.errors import RaydgError
from raydg.methods import METHODS
from raydg.methods.csac import (
    CSAC,
    alignment_loss,
    attention_weights,
    divergence_weights,
    mmd,
    semantic_aggregate,
    tapped,
)
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from raydg.plots import plot
from tests.conftest import tiny_config

# three clients' 2-d "layers"; their mean is (1, 1)
LAYER = [np.array([0.0, 0.0]), np.array([3.0, 0.0]), np.array([0.0, 3.0])]
R2, R5 = math.sqrt(2), math.sqrt(5)
EXPECTED = {  # distances to the mean, by hand: L2 (sqrt2, sqrt5, sqrt5), L1 (2, 3, 3)
    "l2": [R2 / (R2 + 2 * R5), R5 / (R2 + 2 * R5), R5 / (R2 + 2 * R5)],
    "l1": [2 / 8, 3 / 8, 3 / 8],
    # cosine: client 0 is the zero vector (distance 0); the others 1 - 1/sqrt2 each
    "cosine": [0.0, 0.5, 0.5],
    "equal": [1 / 3, 1 / 3, 1 / 3],
    "similarity": [(1 / R2) / (1 / R2 + 2 / R5), (1 / R5) / (1 / R2 + 2 / R5),
                   (1 / R5) / (1 / R2 + 2 / R5)],
}


def _method(**options):
    cls = METHODS.get("csac")
    return cls(cls.parse_options(options))


@pytest.mark.parametrize("distance", sorted(EXPECTED))
def test_aggregation_weights_per_distance(distance):
    np.testing.assert_allclose(divergence_weights(LAYER, distance), EXPECTED[distance])


def test_fused_layer_is_the_weighted_sum_and_identical_models_fall_back_to_equal():
    states = [{"w": t.reshape(1, 2).astype(np.float32),
               "n": np.array(c, dtype=np.int64)} for c, t in enumerate(LAYER)]
    fused, weights = semantic_aggregate(states, "l1")
    np.testing.assert_allclose(fused["w"][0], [3 * 3 / 8, 3 * 3 / 8], rtol=1e-6)
    assert fused["w"].dtype == np.float32
    assert fused["n"] == 1  # integer buffers: plain average, rounded
    assert set(weights) == {"w"}
    same = [np.ones(4)] * 3
    np.testing.assert_allclose(divergence_weights(same, "l2"), [1 / 3] * 3)


def _numpy_alpha(a, b):
    """Eq. (7)-(9) sample by sample: averaged position (A^T B) and channel (A B^T) maps."""
    L = len(a)
    pos, chan = np.zeros((L, L)), np.zeros((L, L))
    for i in range(L):
        for j in range(L):
            A = a[i].reshape(a[i].shape[0], a[i].shape[1], -1)
            B = b[j].reshape(b[j].shape[0], b[j].shape[1], -1)
            pos[i, j] = np.mean([A[s].T @ B[s] for s in range(len(A))])
            chan[i, j] = np.mean([A[s] @ B[s].T for s in range(len(A))])

    def softmax(e):
        z = np.exp(e - e.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    return softmax(pos), softmax(chan)


def test_attention_weights_match_eq_7_to_9_and_sum_to_one():
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(3, 4, 2, 2, generator=g) * 0.5 for _ in range(3)]
    b = [torch.randn(3, 4, 2, 2, generator=g) * 0.5 + 0.2 * k for k in range(3)]
    pos, chan = _numpy_alpha([t.numpy() for t in a], [t.numpy() for t in b])
    both = attention_weights(a, b, "both").numpy()
    np.testing.assert_allclose(both, 0.5 * (pos + chan), rtol=1e-5)
    np.testing.assert_allclose(attention_weights(a, b, "position").numpy(), pos, rtol=1e-5)
    np.testing.assert_allclose(attention_weights(a, b, "channel").numpy(), chan, rtol=1e-5)
    np.testing.assert_allclose(attention_weights(a, b, "uniform").numpy(), np.full((3, 3), 1 / 3))
    for use in ("both", "position", "channel", "uniform"):
        np.testing.assert_allclose(attention_weights(a, b, use).sum(1).numpy(), 1.0, rtol=1e-6)
    assert not np.allclose(both, 1 / 3)  # the weights do depend on the features


def _numpy_mmd(x, y):
    """The multi-kernel quadratic MMD^2, pair by pair."""
    z = np.concatenate([x.reshape(len(x), -1), y.reshape(len(y), -1)]).astype(np.float64)
    m = len(z)
    d2 = np.array([[np.sum((z[i] - z[j]) ** 2) for j in range(m)] for i in range(m)])
    base = d2.sum() / (m * m - m)
    k = sum(np.exp(-d2 / (base * 3.0 ** p)) for p in range(-3, 2))
    n = len(x)
    return k[:n, :n].mean() + k[n:, n:].mean() - 2 * k[:n, n:].mean()


def test_mmd_matches_numpy_is_zero_for_identical_samples_and_grows_with_shift():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 2, 3, 3, generator=g)
    y = torch.randn(8, 2, 3, 3, generator=g)
    assert float(mmd(x, y)) == pytest.approx(_numpy_mmd(x.numpy(), y.numpy()), rel=1e-4)
    assert abs(float(mmd(x, x.clone()))) < 1e-5
    values = [float(mmd(x, y + shift)) for shift in (0.0, 0.5, 1.0, 2.0)]
    assert values == sorted(values) and len(set(values)) == len(values), values
    assert values[-1] == pytest.approx(_numpy_mmd(x.numpy(), (y + 2.0).numpy()), rel=1e-4)


def test_same_layer_alignment_is_the_diagonal_only():
    g = torch.Generator().manual_seed(2)
    a = [torch.randn(4, 2, 2, 2, generator=g) for _ in range(2)]
    b = [torch.randn(4, 2, 2, 2, generator=g) + 1 for _ in range(2)]
    same = alignment_loss(a, b, "same", "both", mmd)
    assert float(same) == pytest.approx(float(mmd(a[0], b[0]) + mmd(a[1], b[1])), rel=1e-6)
    alpha = attention_weights(a, b, "both")
    cross = sum(float(alpha[i, j]) * float(mmd(a[i], b[j])) for i in range(2) for j in range(2))
    assert float(alignment_loss(a, b, "cross", "both", mmd)) == pytest.approx(cross, rel=1e-6)


def test_projections_bring_resnet18_layers_to_32x7x7():
    """§4.1 / reference notes: layer2-4 (28, 14, 7 at 224 px) projected to 32 x 7 x 7."""
    model = _method().build_model(ModelSpec("resnet18", 3, 7, 224))
    calib = model.calibration
    assert calib.layers == ["features.layer2", "features.layer3", "features.layer4"]
    assert [p.kernel_size for p in calib.fused] == [(22, 22), (3, 3), (1, 1)]
    model.eval()
    with torch.no_grad():
        _, feats = tapped(model, calib.layers, torch.zeros(2, 3, 224, 224))
    assert [tuple(p(f).shape) for p, f in zip(calib.local, feats, strict=True)] == [
        (2, 32, 7, 7)] * 3


def test_the_mnist_cnn_aligns_its_two_conv_layers_projected_to_the_last_ones_size():
    """§4.1: "the last two convolution layers of MNIST CNN" (32 x 28 x 28 and 64 x 14 x 14 at
    28 px, after their ReLUs), never the fully-connected layer's ReLU."""
    model = _method().build_model(ModelSpec("mnist-cnn", 1, 10, 28))
    calib = model.calibration
    assert calib.layers == ["features.1", "features.4"]
    assert [p.kernel_size for p in calib.fused] == [(3, 3), (1, 1)]  # 28 -> 14 -> 14
    model.eval()
    with torch.no_grad():
        _, feats = tapped(model, calib.layers, torch.zeros(2, 1, 28, 28))
    assert [tuple(f.shape) for f in feats] == [(2, 32, 28, 28), (2, 64, 14, 14)]
    assert [tuple(p(f).shape) for p, f in zip(calib.local, feats, strict=True)] == [
        (2, 32, 14, 14)] * 2


def _host(**options):
    cfg = tiny_config(dataset="digits-rot", target="M75", method="csac", local_steps=3,
                      options={"acquire_steps": 4, **options})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))[:2]
    method = _method(**cfg.options)
    spec = ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size)
    torch.manual_seed(0)
    init = state.to_numpy(method.build_model(spec))
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients)
    done = {c.client_id: host.phase("acquire", c.client_id, init, init, 0) for c in clients}
    assert {steps for _, steps in done.values()} == {method.options.acquire_steps}  # counted
    return host, method, init, {c: result for c, (result, _) in done.items()}


def test_local_model_is_frozen_after_acquisition():
    host, _, init, acquired = _host()
    assert any(not np.array_equal(acquired[0][k], init[k]) for k in init)  # it was trained
    kept = {c: {k: v.copy() for k, v in s.items()} for c, s in acquired.items()}
    fused, _ = semantic_aggregate([acquired[0], acquired[1]], "l2")
    for rnd in (1, 2):
        uploads = [host.train(c, fused, rnd) for c in (0, 1)]
        fused, _ = semantic_aggregate([u.state for u in uploads], "l2")
    assert any(not np.array_equal(fused[k], kept[0][k]) for k in fused)  # M moved on
    for c in (0, 1):
        local = host.slots[c].state.memory["local_model"]
        assert all(np.array_equal(local[k], kept[c][k]) for k in kept[c])


def test_cross_layer_term_is_live_with_gradients_to_m_and_both_projections():
    host, method, _, acquired = _host()
    fused, _ = semantic_aggregate([acquired[0], acquired[1]], "l2")
    ctx = host._context(0, 1, fused)
    method.start_round(ctx)
    x, y = next(ctx.batches())
    total = method.loss(ctx, x, y)
    ce = F.cross_entropy(ctx.model(x), y)
    assert float((total - ce).detach()) > 1e-3  # lambda * L_AL is non-zero
    total.backward()
    calib = ctx.model.calibration
    for module in (calib.fused[0], calib.local[0], calib.fused[1], calib.local[1],
                   ctx.model.features[4]):
        assert module.weight.grad is not None and module.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in ctx.scratch["local_model"].parameters())
    plain = _host(alignment="none")
    ctx = plain[0]._context(0, 1, fused)
    plain[1].start_round(ctx)
    x, y = next(ctx.batches())
    assert float(plain[1].loss(ctx, x, y).detach()) == pytest.approx(
        float(F.cross_entropy(ctx.model(x), y).detach()), rel=1e-6)


def test_label_smoothing_is_eq_2():
    logits = torch.tensor([[2.0, 0.0, -1.0]])
    p = np.array([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3])
    logq = logits.numpy()[0] - np.log(np.exp(logits.numpy()[0]).sum())
    expected = -(p * logq).sum()
    got = F.cross_entropy(logits, torch.tensor([0]), label_smoothing=0.1)
    assert float(got) == pytest.approx(expected, rel=1e-6)


def test_options_are_checked():
    with pytest.raises(RaydgError, match="distance"):
        _method(distance="l3")
    with pytest.raises(RaydgError, match="no loss"):
        _method(cross_entropy=False, alignment="none")
    with pytest.raises(RaydgError, match="layers"):
        _method(layers=4).build_model(ModelSpec("cnn", 3, 10, 16))


@pytest.mark.slow
def test_a_csac_run_exchanges_only_model_state_and_logs_weights(warm_actors, tmp_path):
    cfg = tiny_config(dataset="digits-rot", target="M75", method="csac", rounds=2,
                      local_steps=2, options={"acquire_steps": 2})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    full = state.nbytes(sim.global_state)
    result = sim.run()
    ledger = result.tables["ledger"]
    assert {r["kind"] for r in ledger} == {"parameters", "bn_statistics"}
    for rnd in (0, 1, 2):  # acquisition, then two calibration rounds
        for direction in ("up", "down"):
            rows = [r for r in ledger if r["round"] == rnd and r["direction"] == direction]
            per_client = {}
            for r in rows:
                per_client[r["client"]] = per_client.get(r["client"], 0) + r["bytes"]
            assert per_client == dict.fromkeys(range(5), full), (rnd, direction)
    weights = result.tables["aggregation_weights"]
    assert {r["round"] for r in weights} == {0, 1, 2}
    groups: dict = {}
    for r in weights:
        groups.setdefault((r["round"], r["layer"]), []).append(r["weight"])
    assert all(len(w) == 5 and sum(w) == pytest.approx(1.0) for w in groups.values())
    assert "calibration.fused.0.weight" in {layer for _, layer in groups}
    spec = result.plots["aggregation_weights"]
    assert spec[-1] == "layer"  # one panel per layer, one line per client
    plot(weights, spec, tmp_path / "w.png")
    assert (tmp_path / "w.png").read_bytes()[:4] == b"\x89PNG"


def test_acquisition_length_follows_the_authors_epochs():
    cfg = tiny_config(local_steps=20)
    # reference notes: 30 epochs x 60 iterations of acquisition, 10 (5 on Rotated MNIST)
    # epochs x 20 iterations of calibration per round, which local_steps stands for
    assert CSAC.setup_steps(_method().options, cfg) == 20 * 30 * 60 // (10 * 20)
    assert CSAC.setup_steps(_method(calibration_epochs=5).options, cfg) == 20 * 30 * 60 // 100
    assert CSAC.setup_steps(_method(acquire_steps=7).options, cfg) == 7


def test_frozen_local_projection_keeps_its_weights_and_the_alignment_is_logged():
    host, _, _, acquired = _host(freeze_local_projection=True)
    fused, _ = semantic_aggregate([acquired[0], acquired[1]], "l2")
    upload = host.train(0, fused, 1)
    local = [k for k in fused if k.startswith("calibration.local.")]
    own = [k for k in fused if k.startswith("calibration.fused.") and k.endswith("weight")]
    assert local and all(np.array_equal(upload.state[k], fused[k]) for k in local)
    assert any(not np.array_equal(upload.state[k], fused[k]) for k in own)
    assert upload.metrics["csac/alignment"] > 0 and upload.metrics["csac/ce"] > 0
    trained = _host()[0].train(0, fused, 1)  # by default both projections train
    assert any(not np.array_equal(trained.state[k], fused[k]) for k in local)
