"""FedFD-A against numpy evaluations of FedFD-A Eq. (6)-(7): the instance feature adapter, its
alternating steps, inference modes and alpha analysis, and a run on Ray. FedFD: test_fedfd.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raydg import state
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.methods import METHODS
from raydg.methods.fedfd import mix_layers
from raydg.models import ModelSpec
from tests.conftest import tiny_config
from tests.test_fedfd import EPS, _fedfd, _first_round, _host, _mixbn, _model


def test_adapter_alpha_range_mean_and_inference():
    layer = _mixbn(channels=4, adapter_hidden=4)
    with torch.no_grad():  # make eps and delta spread well beyond [0, 1]
        layer.adapter[2].weight.mul_(20)
        layer.adapter[2].bias.copy_(torch.tensor([0.5, 0.4]))  # delta bias, eps bias
    x = torch.randn(16, 4, 3, 3) * 3
    mu_i = x.mean(dim=(2, 3))
    sigma_i = (x.var(dim=(2, 3), unbiased=False) + EPS).sqrt()
    mu_g, sigma_g = layer.running_mean, (layer.running_var + EPS).sqrt()
    with torch.no_grad():
        delta, eps = layer.adapter(torch.cat([mu_i - mu_g, sigma_i - sigma_g], 1)).chunk(2, 1)
        layer.train()
        torch.manual_seed(0)
        draws = torch.stack([layer.adapter_alpha(mu_i, sigma_i, mu_g, sigma_g)
                             for _ in range(4000)])
        layer.eval()
        test_alpha = layer.adapter_alpha(mu_i, sigma_i, mu_g, sigma_g)
    assert draws.shape == (4000, 16, 1) and draws.min() >= 0 and draws.max() <= 1
    assert (draws == 0).any() and (draws == 1).any()  # the clamp T is active at both ends
    # reparameterised: alpha = clamp(z*delta + eps); E[clamp(...)] under z ~ N(0, 1)
    z = np.random.default_rng(0).standard_normal((200_000, 1, 1))
    expected = np.clip(z * delta.numpy() + eps.numpy(), 0, 1).mean(axis=0)
    np.testing.assert_allclose(draws.mean(0).numpy(), expected, atol=0.03)
    np.testing.assert_array_equal(test_alpha.numpy(), eps.clamp(0, 1).numpy())  # T(eps)


def test_alternating_steps_leave_the_frozen_half_unchanged():
    _, method, ctx = _first_round("fedfd-a")
    main, adapters = method.split_params(ctx.model)
    assert adapters and len(main) + len(adapters) == len(list(ctx.model.parameters()))
    x, y = next(ctx.batches())
    snap = {id(p): p.detach().clone() for p in ctx.model.parameters()}
    method.main_step(ctx, x, y)
    assert all(torch.equal(p, snap[id(p)]) for p in adapters)
    assert any(not torch.equal(p, snap[id(p)]) for p in main)
    snap = {id(p): p.detach().clone() for p in ctx.model.parameters()}
    buffers = {k: v.clone() for k, v in ctx.model.state_dict().items() if "running" in k}
    method.adapter_step(ctx, x, y)
    assert all(torch.equal(p, snap[id(p)]) for p in main)
    assert any(not torch.equal(p, snap[id(p)]) for p in adapters)
    assert all(torch.equal(v, buffers[k]) for k, v in ctx.model.state_dict().items()
               if "running" in k)


def test_inference_is_one_forward_pass_per_mode():
    method = _fedfd("fedfd-a")
    model = _model(method).eval()
    calls = []
    model.features.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(5, 3, 16, 16)
    for mode in method.eval_modes:
        calls.clear()
        with torch.no_grad():
            out = method.predict(model, x, mode)
        assert out.shape == (5, 10) and len(calls) == 1, mode
    assert method.eval_modes[0] == "adapter"


def test_adapter_parameter_count_matches_table_4():
    """FedFD-A Table 4: ResNet-18 grows by 0.22M parameters (11.31M -> 11.53M)."""
    spec = ModelSpec("resnet18", 3, 7, 224)
    base = sum(p.numel() for p in METHODS.get("fedfd")().build_model(spec).parameters())
    with_adapter = sum(p.numel() for p in _fedfd("fedfd-a").build_model(spec).parameters())
    assert (with_adapter - base) / 1e6 == pytest.approx(0.22, abs=0.005)


def test_fedfd_a_runs_on_ray_and_reports_every_inference_mode(warm_actors):
    from raydg.api import simulation

    cfg = tiny_config(method="fedfd-a", rounds=2, local_steps=2, clients=4, actors=2)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    result = simulation(cfg, data, log=lambda _: None).run()
    assert set(result.selected) == {"adapter", "global", "instance", "fixed", "random"}
    assert result.history[-1]["target_acc"] == result.history[-1]["target_acc/adapter"]
    alphas = result.tables["target_alpha"]
    assert len(alphas) == 3 * len(data.domain(cfg.target).y)  # 3 BN layers x target images
    assert all(0 <= r["alpha"] <= 1 for r in alphas)
    assert result.plots == {"target_alpha": ("box", "layer", "alpha")}
    assert all(np.isfinite(r["train_loss"]) for r in result.history)
    for layer in {r["layer"] for r in alphas}:  # the summary the report can show
        mine = [r["alpha"] for r in alphas if r["layer"] == layer]
        assert result.final[f"fedfd-a/target_alpha/{layer}"] == pytest.approx(np.mean(mine))
        assert result.final[f"fedfd-a/target_alpha_zero/{layer}"] == pytest.approx(
            np.mean([a == 0 for a in mine]))


@pytest.mark.parametrize(("eps_bias", "expected"), [(0.3, 0.3), (1.7, 1.0), (-0.4, 0.0)])
def test_alpha_analysis_reports_clamped_eps_per_layer_and_image(eps_bias, expected, tmp_path):
    method = _fedfd("fedfd-a")
    model = _model(method).eval()
    layers = mix_layers(model)
    with torch.no_grad():  # adapter output (delta, eps) = (0, eps_bias) for every input
        for _, m in layers:
            m.adapter[2].weight.zero_()
            m.adapter[2].bias.copy_(torch.tensor([0.0, eps_bias]))
    batches = (torch.randn(n, 3, 16, 16) for n in (4, 3))
    rows = method.analyze(model, batches)["alpha"]
    assert len(rows) == len(layers) * 7
    assert [r["layer"] for r in rows[::7]] == [name for name, _ in layers]
    assert all(r["alpha"] == pytest.approx(expected) for r in rows)
    assert all(m.record is None for _, m in layers)
    from raydg.plots import plot

    plot(rows, ("box", "layer", "alpha"), tmp_path / "alpha.png")
    assert (tmp_path / "alpha.png").read_bytes()[:4] == b"\x89PNG"


def test_warmup_rounds_train_the_base_framework_alone():
    host, method, spec = _host("fedfd-a", warmup_rounds=1)
    torch.manual_seed(0)
    global_state = state.to_numpy(method.build_model(spec))
    for rnd, warming in ((1, True), (2, False)):
        ctx = host._context(0, rnd, global_state)
        method.start_round(ctx)
        x, y = next(ctx.batches())
        ce = torch.nn.functional.cross_entropy(ctx.model(x), y).item()
        assert (method.loss(ctx, x, y).item() == pytest.approx(ce, rel=1e-6)) == warming
        _, adapters = method.split_params(ctx.model)
        snap = [p.detach().clone() for p in adapters]
        method.train_step(ctx, x, y)
        moved = any(not torch.equal(p, s) for p, s in zip(adapters, snap, strict=True))
        assert moved != warming, rnd
        assert ("fedfd/cafl" in ctx.metrics) != warming  # the decoupling losses are logged


@pytest.mark.parametrize("channel", [False, True])
def test_adapter_eps_init_starts_every_layer_at_that_alpha_for_a_neutral_input(channel):
    """eps's bias at 0.5 (delta's untouched): an image with the global statistics gets
    alpha = 0.5 in every layer at inference; out-of-range values are refused."""
    options = {"adapter_eps_init": 0.5, "adapter_alpha": "channel" if channel else "scalar"}
    cls = METHODS.get("fedfd-a")
    torch.manual_seed(0)
    model = cls(cls.parse_options(options)).build_model(ModelSpec("cnn", 1, 10, 16))
    for _, layer in mix_layers(model):
        bias, k = layer.adapter[2].bias, layer.adapter[2].bias.numel() // 2
        assert torch.all(bias[k:] == 0.5)
        c = layer.num_features
        layer.eval()
        stats = torch.zeros(2, c), torch.ones(2, c)
        hidden = layer.adapter[1](layer.adapter[0](torch.zeros(2, 2 * c)))
        expected = (hidden @ layer.adapter[2].weight.T + bias)[:, k:].clamp(0, 1)
        got = layer.adapter_alpha(stats[0], stats[1], stats[0], stats[1])
        torch.testing.assert_close(got, expected)
        assert torch.all((got - 0.5).abs() < 0.5)  # inside the clamp: it passes a gradient
    with pytest.raises(RaydgError, match="adapter_eps_init"):
        cls.parse_options({"adapter_eps_init": 1.5})
    assert cls.Options().adapter_eps_init == 0.5  # the clamp's centre by default
    assert cls.parse_options({"adapter_eps_init": None}).adapter_eps_init is None  # PyTorch's
    with pytest.raises(RaydgError, match="adapter_reduction"):  # None only where it is allowed
        cls.parse_options({"adapter_reduction": None})


@pytest.mark.parametrize(("eps_bias", "alpha", "zero", "gradient"),
                         [(-1.0, 0.0, 1.0, False), (0.5, 0.5, 0.0, True)])
def test_adapter_steps_log_alpha_its_clamped_share_and_the_gradient(eps_bias, alpha, zero,
                                                                   gradient):
    """Adapters whose output is (delta, eps) = (0, eps_bias) for every input: alpha = T(eps)
    exactly. Below the clamp (the dead zone) no gradient reaches them; inside it one does."""
    _, method, ctx = _first_round("fedfd-a")
    with torch.no_grad():
        for _, m in mix_layers(ctx.model):
            m.adapter[2].weight.zero_()
            m.adapter[2].bias.copy_(torch.tensor([0.0, eps_bias]))
    x, y = next(ctx.batches())
    method.adapter_step(ctx, x, y)
    logged = {k[8:]: v for k, v in ctx.metrics.items() if k.startswith("fedfd-a/")}
    assert logged["alpha"] == logged["eps"] == [alpha]
    assert logged["alpha_zero"] == logged["eps_zero"] == [zero]
    assert (logged["adapter_grad"][0] > 0) == gradient
    assert all(m.record is None for _, m in mix_layers(ctx.model))  # recording stopped


def test_adapter_lr_scale_multiplies_the_adapters_learning_rate_only():
    host, method, spec = _host("fedfd-a", adapter_lr_scale=10.0)
    ctx = host._context(0, 1, state.to_numpy(method.build_model(spec)))
    method.start_round(ctx)
    lr = host.cfg.lr
    assert [g["lr"] for g in ctx.optimizer.param_groups] == [lr]
    assert [g["lr"] for g in ctx.scratch["adapter_optimizer"].param_groups] == [
        pytest.approx(10 * lr)]
    with pytest.raises(RaydgError, match="adapter_lr_scale"):
        METHODS.get("fedfd-a").parse_options({"adapter_lr_scale": 0})
