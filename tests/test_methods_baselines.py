"""FedBN, SiloBN and FedProx against independent expectations (in-process, no Ray)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raydg import state
from raydg.datasets import load_dataset
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import METHODS
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from tests.conftest import tiny_config

BN_SUFFIXES = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def _bn_tensor_keys(model: nn.Module) -> set[str]:
    """Independently: every state key under a BatchNorm2d module."""
    return {f"{name}.{s}" for name, m in model.named_modules()
            if type(m) is nn.BatchNorm2d for s in BN_SUFFIXES}


def _two_rounds(method: str):
    """Train two clients for a round, aggregate, and load round 2's view of each client."""
    cfg = tiny_config(method=method)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    clients = make_clients(data, Partition.of(cfg, clients=2 * 3))[:2]
    spec = ModelSpec(cfg.model, data.channels, 10, cfg.image_size)
    method_cls = METHODS.get(method)
    host = ClientHost(RuntimeSpec(method_cls(), cfg, spec, data.mean, data.std), clients)
    torch.manual_seed(0)
    initial = state.to_numpy(host.method.build_model(spec))
    uploads = [host.train(c.client_id, initial, 1) for c in clients]
    new_global = state.weighted_average([u.state for u in uploads],
                                        [u.num_samples for u in uploads])
    views = {}
    for c in clients:
        host._context(c.client_id, 2, new_global)
        views[c.client_id] = state.to_numpy(host.model)
    return host, uploads, new_global, views


@pytest.mark.parametrize(("method", "local"), [
    ("fedbn", _bn_tensor_keys),
    ("silobn", lambda m: {k for k in _bn_tensor_keys(m)
                          if k.rsplit(".", 1)[1] in ("running_mean", "running_var",
                                                     "num_batches_tracked")}),
    ("fedavg", lambda m: set()),
])
def test_local_keys_and_round_two_view(method, local):
    host, uploads, new_global, views = _two_rounds(method)
    expected_local = local(host.model)
    assert host.local_keys == expected_local
    for u in uploads:
        view = views[u.client_id]
        for key in new_global:
            source = u.state if key in expected_local else new_global
            np.testing.assert_array_equal(view[key], source[key], err_msg=f"{method} {key}")
    if expected_local:  # the local tensors really differ between the two clients
        k = sorted(k for k in expected_local if "running_mean" in k)[0]
        assert not np.array_equal(views[0][k], views[1][k])


def test_fedprox_gradient_is_ce_gradient_plus_mu_times_displacement():
    cfg = tiny_config(method="fedprox", options={"mu": 0.3})
    method = METHODS.get("fedprox")(METHODS.get("fedprox").parse_options(cfg.options))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    anchor = {k: v.detach().clone().numpy() for k, v in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    logged: dict[str, tuple[float, bool]] = {}
    ctx = type("Ctx", (), {})()
    ctx.model, ctx.scratch = model, {}
    ctx.log = lambda name, value, term=False: logged.update({name: (float(value), term)})
    ctx.scratch["anchor"] = [(p, torch.from_numpy(anchor[k]))
                             for k, p in model.named_parameters()]
    x, y = torch.randn(5, 12), torch.tensor([0, 1, 2, 1, 0])
    method.loss(ctx, x, y).backward()
    squared = sum(((p.detach().numpy() - anchor[k]) ** 2).sum()
                  for k, p in model.named_parameters())
    assert logged["fedprox/prox"][0] == pytest.approx(squared, rel=1e-5)
    assert logged["fedprox/prox"][1]  # a loss term, which the divergence guard may name
    prox_grads = {k: p.grad.clone().numpy() for k, p in model.named_parameters()}
    model.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    for k, p in model.named_parameters():
        analytic = p.grad.numpy() + 0.3 * (p.detach().numpy() - anchor[k])
        np.testing.assert_allclose(prox_grads[k], analytic, rtol=1e-5, atol=1e-6)


def test_validate_with_local_statistics_matches_independent_evaluation():
    host, uploads, new_global, _ = _two_rounds("fedbn")
    got, _ = host.validate(new_global, with_local=True)
    spec = ModelSpec(host.cfg.model, 3, 10, host.cfg.image_size)
    for u in uploads:
        data = host.slots[u.client_id].data
        for key, local in (("val_acc", False), ("val_acc_local", True)):
            model = METHODS.get("fedbn")().build_model(spec).eval()
            weights = {k: (u.state if local and k in host.local_keys else new_global)[k]
                       for k in new_global}
            model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
            with torch.no_grad():
                pred = model(host.inputs(data.val_x)).argmax(1).numpy()
            assert got[u.client_id][key] == pytest.approx((pred == data.val_y).mean())
