"""FedAvg aggregation against hand-computed weighted means."""

from __future__ import annotations

import types

import numpy as np

from raydg import state
from raydg.methods import METHODS, Upload
from tests.conftest import tiny_config


def test_weighted_average_matches_hand_computation():
    a = {"w": np.array([1.0, 2.0], dtype=np.float32), "n": np.array(10, dtype=np.int64)}
    b = {"w": np.array([3.0, 6.0], dtype=np.float32), "n": np.array(20, dtype=np.int64)}
    c = {"w": np.array([-1.0, 0.0], dtype=np.float32), "n": np.array(40, dtype=np.int64)}
    out = state.weighted_average([a, b, c], [100, 300, 100])
    # (100*[1,2] + 300*[3,6] + 100*[-1,0]) / 500 = [900, 2000] / 500 = [1.8, 4.0]
    np.testing.assert_array_equal(out["w"], np.array([1.8, 4.0], dtype=np.float32))
    assert out["w"].dtype == np.float32
    # integer buffers: (100*10 + 300*20 + 100*40) / 500 = 22
    assert out["n"] == 22 and out["n"].dtype == np.int64


def _server(agg_weights: str):
    return types.SimpleNamespace(config=tiny_config(agg_weights=agg_weights))


def test_fedavg_weights_by_sample_count_or_uniformly():
    uploads = [
        Upload(0, 30, {"w": np.array([0.0, 3.0], dtype=np.float32)}),
        Upload(1, 10, {"w": np.array([4.0, 7.0], dtype=np.float32)}),
    ]
    fedavg = METHODS.get("fedavg")()
    by_n = fedavg.aggregate(_server("samples"), uploads)["w"]
    np.testing.assert_allclose(by_n, [(30 * 0 + 10 * 4) / 40, (30 * 3 + 10 * 7) / 40])
    uniform = fedavg.aggregate(_server("uniform"), uploads)["w"]
    np.testing.assert_allclose(uniform, [2.0, 5.0])


def test_weighted_average_equals_float64_numpy_mean():
    rng = np.random.default_rng(0)
    states = [{"w": rng.normal(size=(50,)).astype(np.float32)} for _ in range(5)]
    weights = [3, 1, 4, 1, 5]
    forward = state.weighted_average(states, weights)["w"]
    pairs = zip(states, weights, strict=True)
    expected = sum(w * s["w"].astype(np.float64) for s, w in pairs) / sum(weights)
    np.testing.assert_allclose(forward, expected, rtol=1e-6)


def test_weighted_average_keeps_zero_dim_arrays():
    out = state.weighted_average([{"n": np.array(3)}, {"n": np.array(5)}], [1, 1])
    assert isinstance(out["n"], np.ndarray) and out["n"].shape == () and out["n"] == 4
