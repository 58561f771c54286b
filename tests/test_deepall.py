"""DeepAll: the pooled client holds exactly the federation's data; steps see K x B images."""

from __future__ import annotations

import numpy as np
import pytest

from raydg import state
from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.errors import RaydgError
from raydg.methods import METHODS
from raydg.methods.deepall import DeepAll
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config


def _rows(x: np.ndarray, y: np.ndarray) -> list[bytes]:
    return sorted(xi.tobytes() + bytes([int(yi)]) for xi, yi in zip(x, y, strict=True))


def test_pooling_keeps_every_training_and_validation_sample():
    cfg = tiny_config(clients=6)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    method = DeepAll(DeepAll.parse_options({}))
    (pooled,) = method.arrange_clients(clients, cfg)
    assert pooled.client_id == 0 and pooled.domain == "plain+colour-inverted+texture"
    for split in ("train", "val"):
        x, y = (np.concatenate([getattr(c, f"{split}_{v}") for c in clients]) for v in "xy")
        assert _rows(getattr(pooled, f"{split}_x"), getattr(pooled, f"{split}_y")) == _rows(x, y)
    assert method.multiplier == 6  # all 6 clients train each round, B images each


def test_a_step_draws_multiplier_batches_and_counts_them():
    cfg = tiny_config(local_steps=3, batch_size=8, client_selection=False)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    method = DeepAll(DeepAll.parse_options({"batch_multiplier": 2}))
    (pooled,) = method.arrange_clients(make_clients(data, Partition.of(cfg)), cfg)
    seen = []
    train_step = method.train_step
    method.train_step = lambda ctx, x, y: (seen.append(len(y)), train_step(ctx, x, y))[1]
    spec = ModelSpec(cfg.model, data.channels, 10, cfg.image_size)
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), [pooled])
    upload = host.train(0, state.to_numpy(method.build_model(spec)), 1)
    assert seen == [16, 16, 16] and upload.metrics["steps"] == 6


def test_options_are_checked():
    with pytest.raises(RaydgError, match="batch_multiplier"):
        DeepAll.parse_options({"batch_multiplier": -1})
    assert METHODS.get("centralized") is DeepAll


@pytest.mark.parametrize(("dataset", "target"), [("digits-style", "sketch"), ("digits-rot", "M0")])
def test_deepall_runs_end_to_end_with_one_client(dataset, target, warm_actors):
    cfg = tiny_config(dataset=dataset, target=target, method="deepall", rounds=2, local_steps=2)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    result = sim.run()
    sources = len(data.domains) - 1
    assert sim.client_ids == [0] and result.tables["clients"][0]["domain"].count("+") == sources - 1
    assert [r["steps"] for r in result.history] == [2 * sources] * 2  # K x local_steps a round
    assert {r["kind"] for r in result.tables["ledger"]} <= {"parameters", "bn_statistics"}
    assert 0 <= result.selected["global"] <= 1
