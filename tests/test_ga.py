"""FedDG-GA against hand-computed adjustments, on a fake server and composed with FedProx."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from raydg.api import simulation
from raydg.cli import cli
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.methods import METHODS, Upload, method_class
from raydg.methods.ga import GA, adjust, step
from raydg.results import timing_free
from tests.conftest import stopped_and_restored, tiny_config


def test_adjustment_centred_as_the_paper_and_uncentred_as_the_code():
    third = np.full(3, 1 / 3)
    gaps = np.array([0.3, 0.1, -0.1])
    # centred: (g - 0.1) / 0.2 = [1, 0, -1]
    np.testing.assert_allclose(adjust(third, gaps, 0.2 / 3, True),
                               [1 / 3 + 0.2 / 3, 1 / 3, 1 / 3 - 0.2 / 3])
    # uncentred: g / 0.3 = [1, 1/3, -1/3]; sum 1 + 0.2/9, renormalised
    moved = np.array([1 / 3 + 0.2 / 3, 1 / 3 + 0.2 / 9, 1 / 3 - 0.2 / 9])
    np.testing.assert_allclose(adjust(third, gaps, 0.2 / 3, False), moved / moved.sum())


def test_adjustment_clips_to_zero_and_renormalises():
    out = adjust(np.array([0.9, 0.05, 0.05]), np.array([0.0, -1.0, 1.0]), 0.1, True)
    np.testing.assert_allclose(out, np.array([0.9, 0.0, 0.15]) / 1.05)
    np.testing.assert_array_equal(adjust(np.full(2, 0.5), np.zeros(2), 0.1, True), [0.5, 0.5])


def test_step_decays_linearly_from_a_third_of_step_size():
    opts = GA.parse_options({"step_size": 0.3})
    assert step(opts, 1, 10) == pytest.approx(0.1)
    assert step(opts, 10, 10) == pytest.approx(0.01)


class FakeServer:
    """Three clients; the new global model's validation (loss, acc) per client is given."""

    def __init__(self, after: dict[int, tuple[float, float]]) -> None:
        self.config = tiny_config(rounds=4)
        self.round, self.client_ids, self.after = 1, [0, 1, 2], after
        self.domains = {0: "a", 1: "a", 2: "b"}
        self.calls: list[tuple] = []
        self.rows: list[dict] = []

    def call_clients(self, phase, payload=None, *, kind, result_kind=None, clients=None):
        self.calls.append((phase, kind, result_kind, clients))
        return {c: self.after[c] for c in clients}

    def record(self, table, row):
        self.rows.append({"table": table, **row})


def _upload(cid: int, loss: float, acc: float) -> Upload:
    return Upload(cid, 10 * (cid + 1), {}, {"ga/local_loss": loss, "ga/local_acc": acc})


@pytest.mark.parametrize("metric", ["loss", "acc"])
def test_a_round_adjusts_the_weights_that_aggregate_the_next(metric):
    method = GA(GA.parse_options({"metric": metric, "selection": "weighted"}))
    server = FakeServer({0: (0.9, 0.5), 1: (0.5, 0.8), 2: (0.4, 0.9)})
    method.setup(server)
    uploads = [_upload(0, 0.3, 0.9), _upload(1, 0.4, 0.85), _upload(2, 0.4, 0.9)]
    assert method.aggregation_weights(server, uploads) == pytest.approx([1 / 3] * 3)  # not n_k
    metrics = method.on_round_end(server)
    # gaps by hand: loss after - before = [0.6, 0.1, 0]; acc before - after = [0.4, 0.05, 0]
    gaps = np.array([0.6, 0.1, 0.0]) if metric == "loss" else np.array([0.4, 0.05, 0.0])
    g = gaps - gaps.mean()
    expected = np.clip(1 / 3 + 0.2 / 3 * g / np.abs(g).max(), 0, 1)
    expected /= expected.sum()
    np.testing.assert_allclose(method.weights, expected)
    assert metrics["ga/gap_std"] == pytest.approx(gaps.std())
    assert metrics["ga/weight/a"] == pytest.approx(expected[0] + expected[1])  # per domain
    assert metrics["ga/weight/b"] == pytest.approx(expected[2])
    assert server.calls == [("ga", "request", "validation_metrics", [0, 1, 2])]
    assert [r["weight"] for r in server.rows] == pytest.approx(list(expected))
    # selection weights are those that aggregated the evaluated round, not the new ones
    assert method.validation_weights([0, 2]) == pytest.approx([1 / 3, 1 / 3])
    assert method.aggregation_weights(server, uploads) == pytest.approx(list(expected))
    assert method.validation_weights([0, 2]) == pytest.approx([expected[0], expected[2]])


def test_only_sampled_clients_move_and_their_mass_is_kept():
    method = GA(GA.parse_options({}))
    server = FakeServer({0: (1.0, 0.0), 2: (0.2, 0.0)})
    method.setup(server)
    method.aggregation_weights(server, [_upload(0, 0.5, 0), _upload(2, 0.5, 0)])
    method.on_round_end(server)
    # gaps [0.5, -0.3], centred [0.4, -0.4]: a_i +- 0.2/3 for the pair, client 1 untouched
    np.testing.assert_allclose(method.weights, [1 / 3 + 0.2 / 3, 1 / 3, 1 / 3 - 0.2 / 3])


def test_options_and_composition_are_checked():
    with pytest.raises(RaydgError, match=r"metric loss\|acc"):
        GA.parse_options({"metric": "f1"})
    with pytest.raises(RaydgError, match="not an aggregation method"):
        method_class("fedavg", aggregation="fedbn")
    with pytest.raises(RaydgError, match="needs a training method"):
        method_class("ga", aggregation="ga")
    cls = method_class("fedbn", "ccst", "ga")
    parts = (GA, METHODS.get("ccst"), METHODS.get("fedbn"))
    assert cls.name == "fedbn+ccst+ga"
    assert [c for c in cls.__mro__ if c in parts] == list(parts)  # GA's hooks run first
    assert cls.label(cls.parse_options({})) == "fedbn+ccst-pixel+ga"


def test_list_methods_shows_how_each_composes():
    out = CliRunner().invoke(cli, ["list", "methods"]).stdout
    assert "ga (also feddg-ga) [composes: --aggregation] [built-in]: Zhang et al., CVPR 2023" in out
    assert "ccst [composes: --augment]" in out


@pytest.mark.parametrize(("dataset", "target", "method", "rounds"), [
    ("digits-style", "sketch", "fedprox", 3), ("digits-rot", "M30", "fedavg", 2)])
def test_ga_composes_end_to_end_and_its_weights_follow_the_recorded_gaps(
        dataset, target, method, rounds, warm_actors):
    cfg = tiny_config(dataset=dataset, target=target, method=method, aggregation="ga",
                      rounds=rounds, local_steps=2)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    result = simulation(cfg, data, log=lambda _: None).run()
    assert result.method == f"{method}+ga"
    rows = result.tables["ga_weights"]
    clients = sorted({r["client"] for r in rows})
    weights = np.full(len(clients), 1 / len(clients))
    for rnd in range(1, rounds + 1):  # all clients every round: by hand, from the gaps
        gaps = np.array([r["gap"] for r in rows if r["round"] == rnd])
        g = gaps - gaps.mean()
        d = 0.2 / 3 * (1 - (rnd - 1) / rounds)
        weights = np.clip(weights + d * g / np.abs(g).max(), 0, 1)
        weights /= weights.sum()
        np.testing.assert_allclose([r["weight"] for r in rows if r["round"] == rnd], weights)
        domain = {r["client"]: r["domain"] for r in result.tables["clients"]}
        for d in set(domain.values()):  # the per-round metrics sum each domain's clients
            assert result.history[rnd - 1][f"ga/weight/{d}"] == pytest.approx(
                sum(w for c, w in zip(clients, weights, strict=True) if domain[c] == d))
    shared = [r for r in result.tables["ledger"] if r["kind"] == "validation_metrics"]
    assert len(shared) == rounds * len(clients) and all(r["bytes"] == 16 for r in shared)
    assert all(r["direction"] == "up" for r in shared)


def test_ga_refuses_a_method_that_aggregates_without_weights():
    """E.g. CSAC's semantic aggregation never asks for aggregation weights."""
    method = GA(GA.parse_options({}))
    server = FakeServer({})
    method.setup(server)
    with pytest.raises(RaydgError, match="aggregates without aggregation_weights"):
        method.on_round_end(server)


@pytest.mark.slow
def test_a_restored_ga_federation_ends_as_the_undisturbed_one(warm_actors, tmp_path):
    """GA's weights live on the driver: they survive a checkpoint between rounds."""
    cfg = tiny_config(aggregation="ga", clients=4, sample=3, rounds=3, local_steps=2,
                      options={"selection": "weighted"})
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    whole, again, _ = stopped_and_restored(cfg, data, 1, tmp_path / "c")
    for k in whole.global_state:
        np.testing.assert_array_equal(whole.global_state[k], again.global_state[k], err_msg=k)
    assert timing_free(whole.history) == timing_free(again.history)
    assert whole.tables["ga_weights"] == again.tables["ga_weights"]
