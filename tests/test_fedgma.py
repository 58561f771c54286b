"""FedGMA (Tenison et al., TMLR 2023, Algorithm 1) against a hand-computed masked server step,
FedAvg as its tau = 0, eta = 1 edge case, and end to end as a method and an aggregation rule."""

from __future__ import annotations

import numpy as np
import pytest

from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.methods import METHODS, Upload, method_class
from raydg.methods.fedgma import FedGMA
from tests.conftest import tiny_config

GLOBAL = {"conv.weight": np.ones(4, np.float32),
          "bn.running_mean": np.array([100.0], np.float32),
          "bn.num_batches_tracked": np.array(5, np.int64)}
# Delta_k per coordinate; signs: +++ (A = 1), +-- (1/3), --+ (1/3), +-0 (0)
DELTAS = np.array([[0.4, 0.2, -0.2, 0.3],
                   [0.1, -0.1, -0.1, -0.1],
                   [0.2, -0.3, 0.6, 0.0]])
SAMPLES = [10, 20, 10]  # p_k = 1/4, 1/2, 1/4


class FakeServer:
    """What ``aggregate`` reads, and the rows it records."""

    def __init__(self, global_state: dict, local_keys: frozenset = frozenset()) -> None:
        self.config = tiny_config()
        self.global_state, self.local_keys = global_state, set(local_keys)
        self.rows: list[dict] = []

    def record(self, table: str, row: dict) -> None:
        self.rows.append({"table": table, **row})


def _uploads() -> list[Upload]:
    return [Upload(k, n, {"conv.weight": (GLOBAL["conv.weight"] + d).astype(np.float32),
                          "bn.running_mean": np.array([4.0 * k], np.float32),
                          "bn.num_batches_tracked": np.array(10 * (k + 1), np.int64)})
            for k, (n, d) in enumerate(zip(SAMPLES, DELTAS, strict=True))]


def _method(**options) -> FedGMA:
    return FedGMA(FedGMA.parse_options(options))


def paper_step(w, clients, weights, tau, eta, soft=True):
    """Algorithm 1 in plain numpy: w + eta * m (.) sum_k p_k (w_k - w)."""
    d = np.stack([c.astype(np.float64) for c in clients]) - w.astype(np.float64)
    agree = np.abs(np.sign(d).sum(axis=0)) / len(clients)
    m = np.where(agree >= tau, 1.0, agree if soft else 0.0)
    p = np.asarray(weights, np.float64) / np.sum(weights)
    return w + eta * m * (p @ d)


@pytest.mark.parametrize(("mask", "by_hand", "mask_mean"), [
    # mean update (p @ DELTAS) = [0.2, -0.075, 0.05, 0.025]; eta = 0.5; m = [1, 1/3, 1/3, 0]
    ("soft", [1.1, 1 - 0.0125, 1 + 0.05 / 6, 1.0], 5 / 12),
    ("hard", [1.1, 1.0, 1.0, 1.0], 1 / 4)])  # m = [1, 0, 0, 0]
def test_server_step_is_algorithm_1_on_a_hand_example(mask, by_hand, mask_mean):
    method, server = _method(threshold=0.4, server_lr=0.5, mask=mask), FakeServer(GLOBAL)
    uploads = _uploads()
    out = method.aggregate(server, uploads)
    np.testing.assert_allclose(out["conv.weight"], by_hand, rtol=1e-6)
    np.testing.assert_allclose(out["conv.weight"], paper_step(
        GLOBAL["conv.weight"], [u.state["conv.weight"] for u in uploads], SAMPLES, 0.4, 0.5,
        mask == "soft"), rtol=1e-6)
    assert out["conv.weight"].dtype == np.float32
    # BN statistics and counters are FedAvg's: (0 + 2*4 + 8) / 4 = 4, (10 + 2*20 + 30) / 4 = 20
    assert out["bn.running_mean"][0] == pytest.approx(4.0)
    assert out["bn.num_batches_tracked"] == 20
    assert server.rows == [pytest.approx({"table": "gma_mask", "layer": "conv.weight",
                                          "size": 4, "kept": 0.25, "mask_mean": mask_mean})]
    assert method.on_round_end(server) == pytest.approx(
        {"fedgma/kept": 0.25, "fedgma/mask_mean": mask_mean})


def test_local_keys_take_the_base_aggregation_unmasked():
    """A local key (e.g. FedBN's BN tensors under --aggregation fedgma) is averaged, not
    masked: its clients never loaded the global value, so w_k - w is no update."""
    cls = method_class("fedbn", aggregation="fedgma")
    server = FakeServer(GLOBAL, frozenset({"conv.weight"}))
    method = cls(cls.parse_options({}))
    out = method.aggregate(server, _uploads())
    np.testing.assert_allclose(out["conv.weight"], [1.2, 0.925, 1.05, 1.025], rtol=1e-6)
    assert server.rows == [] and method.on_round_end(server) == {}


@pytest.mark.parametrize("mask", ["soft", "hard"])
@pytest.mark.parametrize("agg_weights", ["samples", "uniform"])
def test_threshold_zero_and_unit_server_lr_is_fedavg_exactly(mask, agg_weights):
    rng = np.random.default_rng(0)
    server = FakeServer({"w": rng.normal(size=(3, 5)).astype(np.float32),
                         "bn.running_var": np.ones(5, np.float32),
                         "bn.num_batches_tracked": np.array(7, np.int64)})
    server.config = tiny_config(agg_weights=agg_weights)
    uploads = [Upload(k, int(rng.integers(5, 50)), {
        "w": (server.global_state["w"] + rng.normal(size=(3, 5))).astype(np.float32),
        "bn.running_var": rng.uniform(0.5, 2.0, 5).astype(np.float32),
        "bn.num_batches_tracked": np.array(7 + k, np.int64)}) for k in range(4)]
    out = _method(threshold=0.0, server_lr=1.0, mask=mask).aggregate(server, uploads)
    fedavg = METHODS.get("fedavg")().aggregate(server, uploads)
    assert out.keys() == fedavg.keys()
    for key in fedavg:
        np.testing.assert_array_equal(out[key], fedavg[key], err_msg=key)
        assert out[key].dtype == fedavg[key].dtype


@pytest.mark.parametrize("bad", [{"threshold": -0.1}, {"threshold": 1.5}, {"server_lr": 0.0},
                                 {"server_lr": -1.0}, {"mask": "and"}])
def test_options_out_of_range_are_refused(bad):
    with pytest.raises(RaydgError, match=r"^fedgma: threshold must be in \[0, 1\]"):
        FedGMA.parse_options(bad)


def test_defaults_and_registry():
    assert FedGMA.parse_options({"threshold": 1}) == FedGMA.Options(threshold=1.0)
    assert FedGMA.Options() == FedGMA.Options(threshold=0.4, server_lr=1.0, mask="soft")
    assert METHODS.get("fedgma") is FedGMA and "fedgma" in METHODS.names()
    assert method_class("fedprox", aggregation="fedgma").name == "fedprox+fedgma"
    with pytest.raises(RaydgError, match="needs a training method"):
        method_class("fedgma", aggregation="ga")


@pytest.mark.parametrize(("dataset", "target", "method", "aggregation"), [
    ("digits-style", "sketch", "fedgma", None), ("digits-rot", "M30", "fedprox", "fedgma")])
def test_end_to_end_masks_every_weight_and_shares_only_parameters(
        dataset, target, method, aggregation, warm_actors):
    cfg = tiny_config(dataset=dataset, target=target, method=method, aggregation=aggregation,
                      rounds=1, local_steps=1, actors=1)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    result = simulation(cfg, data, log=lambda _: None).run()
    assert result.method == ("fedgma" if aggregation is None else "fedprox+fedgma")
    weights = {k for k, v in result.global_state.items() if v.dtype.kind == "f"
               and k.rsplit(".", 1)[-1] not in ("running_mean", "running_var")}
    rows = result.tables["gma_mask"]
    for row in result.history:
        mine = [r for r in rows if r["round"] == row["round"]]
        assert {r["layer"] for r in mine} == weights  # BN statistics are not masked
        sizes = np.array([r["size"] for r in mine])
        assert sizes.sum() == sum(result.global_state[k].size for k in weights)
        kept = np.array([r["kept"] for r in mine]) @ sizes / sizes.sum()
        assert row["fedgma/kept"] == pytest.approx(kept)
        assert 0 <= row["fedgma/kept"] <= row["fedgma/mask_mean"] <= 1
    assert {r["kind"] for r in result.tables["ledger"]} == {"parameters", "bn_statistics"}
