"""The local-only bound: member k is client k trained alone; the ensemble averages softmaxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydg import state
from raydg.api import simulation
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import METHODS, Method
from raydg.methods.local import Local
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config


class OneClientServer:
    def __init__(self, global_state):
        self.global_state = global_state


def test_each_member_is_its_client_trained_alone():
    cfg = tiny_config(local_steps=3, client_selection=False)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg))
    spec = ModelSpec(cfg.model, data.channels, 10, cfg.image_size)
    local = Local()
    local.arrange_clients(clients, cfg)
    torch.manual_seed(0)
    ensemble = state.to_numpy(local.build_model(spec))
    host = ClientHost(RuntimeSpec(local, cfg, spec, data.mean, data.std), clients)
    for rnd in (1, 2):
        uploads = [host.train(c.client_id, ensemble, rnd) for c in clients]
        ensemble = local.aggregate(OneClientServer(ensemble), uploads)
    # independently: plain FedAvg with client k as the only client, from member 0's weights
    torch.manual_seed(0)
    alone_state = state.to_numpy(Method().build_model(spec))
    fedavg = ClientHost(RuntimeSpec(Method(), cfg, spec, data.mean, data.std), clients)
    for k, c in enumerate(clients):
        weights = alone_state
        for rnd in (1, 2):
            weights = fedavg.train(c.client_id, weights, rnd).state
        for key, value in weights.items():
            np.testing.assert_array_equal(ensemble[f"members.{k}.{key}"], value, err_msg=key)


def test_prediction_is_the_log_of_the_members_mean_softmax():
    spec = ModelSpec("cnn", 3, 10, 16)
    local = Local()
    local.members = [0, 1, 2]
    torch.manual_seed(1)
    model = local.build_model(spec)
    with torch.no_grad():
        for m in model.members:
            for p in m.parameters():
                p.add_(0.1 * torch.randn_like(p))
    model.eval()
    x = torch.randn(5, 3, 16, 16)
    with torch.no_grad():
        logits = [m(x).numpy().astype(np.float64) for m in model.members]
    probs = [np.exp(z - z.max(1, keepdims=True)) for z in logits]
    mean = np.mean([p / p.sum(1, keepdims=True) for p in probs], axis=0)
    np.testing.assert_allclose(local.predict(model, x, "ensemble").exp().numpy(), mean,
                               rtol=1e-5)
    assert METHODS.get("local-only") is Local


@pytest.mark.parametrize(("dataset", "target"), [("digits-style", "sketch"), ("digits-rot", "M0")])
def test_local_runs_end_to_end(dataset, target, warm_actors):
    cfg = tiny_config(dataset=dataset, target=target, method="local", rounds=1, local_steps=1)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    sim = simulation(cfg, data, log=lambda _: None)
    result = sim.run()
    members = {k.split(".")[1] for k in result.global_state}
    assert members == {str(i) for i in range(len(sim.client_ids))}
    assert result.method == "local" and set(result.selected) == {"ensemble"}
    assert 0 <= result.selected["ensemble"] <= 1
