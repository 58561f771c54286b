"""Planning without Ray: search spaces, federations, hyper-parameter selection, stored results."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from raydg.config import (
    RunConfig,
    Search,
    apply,
    parse_grid,
    parse_search,
    parse_sets,
    split_search,
)
from raydg.config_files import load_yaml
from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.methods.base import learning_rate
from raydg.optim import SGD
from raydg.planning import plan_experiment
from raydg.resolve import resolve
from raydg.results import FederationResult, select_settings


def test_grid_is_every_combination_in_order():
    search = parse_search({"lr": [0.01, 0.02], "options.mu": [0.1, 1, 10]})
    assert search.settings() == [
        {"lr": a, "options.mu": b} for a in (0.01, 0.02) for b in (0.1, 1, 10)]
    assert Search().settings() == [{}]
    assert parse_grid(["lr=0.01,0.02", "options.mu=[1]", "client_selection=false"]) == {
        "lr": [0.01, 0.02], "options.mu": [1], "client_selection": [False]}


def test_random_draws_are_seeded_in_range_and_crossed_with_the_grid():
    spec = {"samples": 5, "seed": 3, "space": {"lr": {"loguniform": [0.001, 0.1]},
                                               "local_steps": {"randint": [2, 4]},
                                               "options.mu": {"choice": [0.1, 1.0]}}}
    search = parse_search({"momentum": [0.0, 0.5]}, spec)
    settings = search.settings()
    assert len(settings) == 10
    assert settings == parse_search({"momentum": [0.0, 0.5]}, spec).settings()  # seeded
    draws = settings[:5]
    assert [s["momentum"] for s in settings] == [0.0] * 5 + [0.5] * 5
    for s, again in zip(draws, settings[5:], strict=True):  # the same draws for each grid point
        assert {k: v for k, v in s.items() if k != "momentum"} == {
            k: v for k, v in again.items() if k != "momentum"}
    assert all(0.001 <= s["lr"] <= 0.1 and s["local_steps"] in (2, 3, 4)
               and s["options.mu"] in (0.1, 1.0) for s in settings)
    # the same draws as numpy's generator with that seed, in key order
    rng = np.random.default_rng(3)
    lr = float(np.exp(rng.uniform(np.log(0.001), np.log(0.1))))
    assert draws[0]["lr"] == lr and draws[0]["local_steps"] == int(rng.integers(2, 5))


BAD_SEARCHES = [
    (({"colour": [1]},), "unknown config key 'colour'"),
    (({"lr": []},), "non-empty list"),
    (({"lr": 0.1},), "non-empty list"),
    (({"seeds": [[1], [2]]},), "cannot vary 'seeds'"),
    (({"dataset": ["pacs"]},), "cannot vary 'dataset'"),
    (({}, {"samples": 0, "space": {"lr": {"uniform": [0, 1]}}}),
     "search key 'random.samples' must be an integer > 0, not 0"),
    (({}, {"samples": 2, "space": {"lr": {"normal": [0, 1]}}}), "needs one of uniform"),
    (({}, {"samples": 2, "space": {"lr": {"loguniform": [0, 1]}}}), "low > 0"),
    (({}, {"samples": 2, "space": {}}), "random.space must map"),
    (({"lr": [1]}, {"samples": 2, "space": {"lr": {"uniform": [0, 1]}}}), "both in the grid"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SEARCHES)
def test_bad_searches_are_refused(args, message):
    with pytest.raises(RaydgError, match=message.replace("(", r"\(")):
        parse_search(*args)


def test_split_search_and_grid_values():
    rest, search = split_search({"dataset": "digits-rot", "grid": {"lr": [0.1, 0.2]}})
    assert rest == {"dataset": "digits-rot"} and search.grid == {"lr": [0.1, 0.2]}
    with pytest.raises(RaydgError, match="--grid expects"):
        parse_grid(["lr"])
    with pytest.raises(RaydgError, match="non-empty list"):
        parse_grid(["lr="])


def test_plan_has_one_federation_per_setting_target_and_seed():
    plan = plan_experiment(RunConfig(dataset="digits-style", seeds=[0, 1]),
                           parse_search({"lr": [0.01, 0.02]}))
    assert len(plan.federations) == 2 * 4 * 2
    keys = [f.key for f in plan.federations]
    assert len(set(keys)) == len(keys)
    first = plan.federations[0]
    assert (first.target, first.seed, first.config.lr, first.key) == (
        "plain", 0, 0.01, "plain-s0-lr=0.01")
    assert {f.config.lr for f in plan.federations[8:]} == {0.02}
    assert all(f.config.seeds == [f.seed] and f.config.rounds == 10 for f in plan.federations)
    # every setting is checked
    with pytest.raises(RaydgError, match="config key 'rounds' must be an integer > 0"):
        plan_experiment(RunConfig(dataset="digits-style"), parse_search({"rounds": [2, 0]}))
    with pytest.raises(RaydgError, match=r"repeats a setting: colour-inverted-s0-lr=0\.1"):
        plan_experiment(RunConfig(dataset="digits-style"), parse_search({"lr": [0.1, 0.1]}))


def _row(setting, target, seed, val, acc):
    return {"method": "fedavg", "setting": setting, "target": target, "seed": seed,
            "mode": "global", "selection": "selected", "val_acc": val, "accuracy": acc}


def test_selection_takes_best_mean_source_validation_and_reports_the_oracle():
    rows = [  # setting a: better validation on t1, worse target accuracy; b: the reverse on t2
        _row("a", "t1", 0, 80, 40), _row("a", "t1", 1, 70, 42),
        _row("b", "t1", 0, 60, 60), _row("b", "t1", 1, 70, 62),
        _row("a", "t2", 0, 50, 30), _row("a", "t2", 1, 50, 34),
        _row("b", "t2", 0, 55, 20), _row("b", "t2", 1, 55, 22),
    ]
    rows += [{**r, "selection": "last", "val_acc": 99} for r in rows]  # never used
    sel = {r["target"]: r for r in select_settings(rows, ["t1", "t2"])}
    assert sel["t1"]["setting"] == "a" and sel["t1"]["val_acc"] == 75
    assert sel["t1"]["accuracy"] == 41 and sel["t1"]["accuracy_std"] == pytest.approx(
        np.std([40, 42], ddof=1))
    assert sel["t1"]["oracle_setting"] == "b" and sel["t1"]["oracle_accuracy"] == 61
    assert sel["t2"]["setting"] == "b" and sel["t2"]["accuracy"] == 21
    assert sel["t2"]["oracle_setting"] == "a"
    per_seed = [np.mean([40, 20]), np.mean([42, 22])]  # seed s: a on t1, b on t2
    assert sel["Avg"]["accuracy"] == pytest.approx(np.mean(per_seed))
    assert sel["Avg"]["accuracy_std"] == pytest.approx(np.std(per_seed, ddof=1))


def test_federation_result_round_trips_without_pickle(tmp_path):
    result = FederationResult(
        method="fedbn", target="sketch", seed=3,
        history=[{"round": 1, "val_acc": 0.5, "target_acc": 0.25}],
        selected_round=1, selected={"global": 0.25}, last={"global": 0.25},
        oracle={"global": 0.25}, oracle_round={"global": 1},
        global_state={"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                      "bn.num_batches_tracked": np.array(7)},
        tables={"ledger": [{"round": 1, "client": 0, "bytes": 10}]},
        plots={"ledger": ("line", "round", "bytes", "client")}, setting={"lr": 0.1})
    result.save(tmp_path / "r")
    back = FederationResult.load(tmp_path / "r")
    assert back.global_state.keys() == result.global_state.keys()
    for k, v in result.global_state.items():
        np.testing.assert_array_equal(back.global_state[k], v)
        assert back.global_state[k].dtype == v.dtype
    back.global_state = result.global_state = {}
    assert back == result


def test_extends_merges_files_and_a_grid_value_may_set_several_keys(tmp_path):
    (tmp_path / "base.yaml").write_text("dataset: digits-rot\nrounds: 7\noptions: {a: 1, b: 2}\n")
    (tmp_path / "sweep.yaml").write_text(
        "extends: base.yaml\nrounds: 3\noptions: {b: 3}\n"
        "grid:\n  method: [fedbn, {method: fedprox, options.mu: 0.1}]\n  lr: [0.1, 0.2]\n")
    values, search = split_search(load_yaml(tmp_path / "sweep.yaml"))
    assert values == {"dataset": "digits-rot", "rounds": 3, "options": {"a": 1, "b": 3}}
    assert search.settings() == [
        {"method": "fedbn", "lr": 0.1}, {"method": "fedbn", "lr": 0.2},
        {"method": "fedprox", "options.mu": 0.1, "lr": 0.1},
        {"method": "fedprox", "options.mu": 0.1, "lr": 0.2}]
    plan = plan_experiment(RunConfig(dataset="digits-style", target="sketch"), search)
    assert [(f.config.method, f.config.options, f.config.lr) for f in plan.federations] == [
        ("fedbn", {}, 0.1), ("fedbn", {}, 0.2), ("fedprox", {"mu": 0.1}, 0.1),
        ("fedprox", {"mu": 0.1}, 0.2)]
    assert plan.label == "fedbn, fedprox"
    (tmp_path / "loop.yaml").write_text("extends: loop.yaml\n")
    with pytest.raises(RaydgError, match="extends itself"):
        load_yaml(tmp_path / "loop.yaml")


def test_method_options_client_selection_and_equal_compute():
    both = {"fedprox": {"mu": 0.1}, "csac": {"acquire_steps": 120}}
    cfg = resolve(RunConfig(dataset="digits-rot", method="fedprox", method_options=both))
    assert cfg.options == {"mu": 0.1} and cfg.client_selection is False  # McMahan: last
    assert resolve(RunConfig(method="fedprox", options={"mu": 1.0},
                             method_options=both)).options == {"mu": 1.0}  # options win
    assert resolve(RunConfig(method="fedfd")).client_selection is True  # FedFD-A §4.1
    assert resolve(RunConfig(method="fedfd", client_selection=False)).client_selection is False
    with pytest.raises(RaydgError, match=r"unknown option\(s\) \['nope'\]"):
        resolve(RunConfig(method="fedavg", method_options={"csac": {"nope": 1}}))
    fed = plan_experiment(RunConfig(dataset="digits-rot", target="M0", method="fedavg",
                                    equal_compute="csac", method_options=both)).federations[0]
    assert fed.config.rounds == 10 + 120 // 20 and fed.label == "fedavg (steps of csac)"
    fed = plan_experiment(RunConfig(dataset="digits-rot", target="M0",
                                    equal_compute="csac")).federations[0]
    assert fed.config.rounds == 10 + 9  # the authors' 30 x 60 : 10 x 20 acquisition ratio


def test_set_reaches_method_options_and_extends_merges_them(tmp_path):
    cfg = apply(RunConfig(), parse_sets(["method_options.fedfd-a.lambda2=1",
                                         "method_options.csac={acquire_steps: 3}"]))
    assert cfg.method_options == {"fedfd-a": {"lambda2": 1}, "csac": {"acquire_steps": 3}}
    (tmp_path / "a.yaml").write_text("method_options: {csac: {x: 1, y: 2}, fedprox: {mu: 1}}\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nmethod_options: {csac: {y: 3}}\n")
    assert load_yaml(tmp_path / "b.yaml")["method_options"] == {
        "csac": {"x": 1, "y": 3}, "fedprox": {"mu": 1}}


def test_cosine_learning_rate_anneals_over_the_rounds():
    cfg = RunConfig(lr=0.1, rounds=4, lr_schedule="cosine")
    expected = 0.1 * 0.5 * (1 + np.cos(np.pi * np.arange(4) / 4))
    np.testing.assert_allclose([learning_rate(cfg, r) for r in (1, 2, 3, 4)], expected)
    assert learning_rate(cfg, 0) == 0.1  # setup phases run at the first round's rate
    assert learning_rate(RunConfig(lr=0.1, rounds=4), 3) == 0.1
    with pytest.raises(RaydgError, match="'lr_schedule' must be one of constant, cosine, not"):
        resolve(RunConfig(lr_schedule="step"))  # a config made in Python is checked too
    with pytest.raises(RaydgError, match="config key 'lr' must be a finite number > 0 or null, "
                                         "not true"):
        resolve(RunConfig(lr=True))


@pytest.mark.parametrize("method", ["fedbn", "silobn", "fedfd", "fedfd-a", "gperxan"])
def test_methods_that_act_on_batchnorm_refuse_a_model_without_it(method):
    with pytest.raises(RaydgError, match=f"{method} acts on BatchNorm layers and model "
                                         r"mnist-cnn has none; .*\(cnn, densenet121, mnist-cnn-bn, "
                                         r"mobilenet_v3_small, resnet101, resnet18"):
        resolve(RunConfig(dataset="rotmnist", method=method, model="mnist-cnn"))
    assert resolve(RunConfig(dataset="rotmnist", method=method, model="cnn")).model == "cnn"
    for fine in ("fedavg", "csac", "elcfs", "fedsr"):
        assert resolve(RunConfig(dataset="rotmnist", method=fine)).model == "mnist-cnn"


@pytest.mark.parametrize("method", ["fedbn", "gperxan"])
def test_a_batchnorm_method_off_a_datasets_default_model_is_named_by_its_model(method):
    """rotmnist's default model has no BatchNorm: a BN method runs on another, and the
    experiment names that model as the setting it changes (the defaults it is compared
    with make no run of their own)."""
    plan = plan_experiment(RunConfig(dataset="rotmnist", method=method, model="mnist-cnn-bn",
                                     target="M0"))
    assert plan.changed == "model=mnist-cnn-bn"
    assert plan.name == f"{method} model=mnist-cnn-bn rotmnist"


def test_planning_builds_no_model_it_does_not_run():
    """Resolving a run builds no other backbone (the ResNets would import torchvision and
    torch._dynamo into the experiment's process: memory and seconds)."""
    code = ("import sys; from raydg.config import RunConfig; from raydg.resolve import resolve; "
            "resolve(RunConfig(dataset='digits-style', method='fedbn')); "
            "print(sorted(m for m in ('torchvision', 'torch._dynamo') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_optimizer_is_sgd_or_adam_with_the_runs_learning_rate_and_decay():
    from torch import nn

    from raydg.methods import ClientContext

    def made(**overrides):
        cfg = resolve(RunConfig(dataset="digits-style", lr=0.02, momentum=0.5,
                                weight_decay=1e-4, **overrides))
        ctx = ClientContext(client_id=0, round=1, data=None, model=None, config=cfg,
                            device=None, global_state={}, memory={}, generator=None,
                            inputs=None, train_inputs=None, evaluate=None)
        return ctx.make_optimizer(nn.Linear(2, 2).parameters())

    (sgd, *_), (adam, *_) = (o.param_groups for o in (made(), made(optimizer="adam")))
    assert isinstance(made(), SGD) and isinstance(made(optimizer="adam"), torch.optim.Adam)
    assert sgd["momentum"] == 0.5 and adam["betas"] == (0.9, 0.999)
    assert sgd["lr"] == adam["lr"] == 0.02
    assert sgd["weight_decay"] == adam["weight_decay"] == 1e-4
    with pytest.raises(RaydgError, match="config key 'optimizer' must be one of sgd, adam, not"):
        resolve(RunConfig(optimizer="rmsprop"))


def test_a_methods_regime_options_apply_below_the_users_and_are_labelled():
    """fedfd/fedfd-a start from cafl_reduction=mean on every backbone but an ImageNet-started
    ResNet (the paper's sum explodes or collapses the others), whatever the dataset: the
    embedded ones and one with no options of its own alike; method_options and options
    override it; every row off the paper's values is named with them, one at the paper's
    values plainly."""
    from raydg.labels import not_paper, row_label

    for dataset in ("digits-style", "digits-gen"):
        cfg = resolve(RunConfig(dataset=dataset, method="fedfd-a"))
        assert cfg.options["cafl_reduction"] == "mean"
        assert row_label(cfg) == "fedfd-a [cafl_reduction=mean]"
    assert resolve(RunConfig(dataset="pacs", method="fedfd-a",
                             pretrained=False)).options == {"cafl_reduction": "mean"}
    assert resolve(RunConfig(dataset="digits-rot", method="fedig")).options == {
        "cafl_reduction": "mean"}  # an alias gets its method's options
    for override in ({"options": {"cafl_reduction": "sum"}},
                     {"method_options": {"fedfd": {"cafl_reduction": "sum"}}}):
        cfg = resolve(RunConfig(dataset="digits-style", method="fedfd", **override))
        assert cfg.options["cafl_reduction"] == "sum" and not_paper(cfg) == ""
        assert row_label(cfg) == "fedfd"
    cfg = resolve(RunConfig(dataset="digits-style", method="fedfd",
                            options={"lambda2": 1}))
    assert row_label(cfg) == "fedfd [lambda2=1.0 cafl_reduction=mean]"  # in field order
    assert resolve(RunConfig(dataset="pacs", method="fedfd")).options == {}
    assert row_label(resolve(RunConfig(dataset="digits-style", method="fedavg"))) == "fedavg"


def test_a_paper_configs_own_options_are_the_papers_and_others_are_labelled():
    """configs/csac-rotmnist.yaml gives CSAC Rotated MNIST's calibration epochs (5, not the
    default 10): no label; a change on top of it, or the file's options under another method,
    are labelled."""
    from raydg.config import split_search
    from raydg.config_files import load_yaml
    from raydg.labels import row_label

    values, _ = split_search(load_yaml("configs/csac-rotmnist.yaml"))
    assert values["paper_options"]["csac"]["calibration_epochs"] == 5
    assert row_label(resolve(apply(RunConfig(), values))) == "csac"
    changed = apply(RunConfig(), {**values, "options": {"lambda_cal": 0.3}})
    assert row_label(resolve(changed)) == "csac [lambda_cal=0.3]"
    plain, _ = split_search({k: v for k, v in load_yaml("configs/csac-rotmnist.yaml").items()
                             if k != "paper"})  # the same settings, not a paper config
    assert row_label(resolve(apply(RunConfig(), plain))) == (
        "csac [acquire_steps=420 calibration_epochs=5]")


def test_options_a_search_varies_are_left_to_the_settings_label():
    plan = plan_experiment(RunConfig(dataset="digits-style", method="fedfd", target="plain"),
                           Search(grid={"options.cafl_reduction": ["sum", "mean"],
                                        "method_options.fedfd.lambda2": [4.0, 1.0]}))
    assert {f.row for f in plan.federations} == {"fedfd"}
    assert {f.not_paper for f in plan.federations} == {  # the tag names them all
        "", "cafl_reduction=mean", "lambda2=1.0 cafl_reduction=mean", "lambda2=1.0"}
    plan = plan_experiment(RunConfig(dataset="digits-style", method="fedfd", target="plain"),
                           Search(grid={"lr": [0.01, 0.02]}))
    assert [f.row for f in plan.federations] == ["fedfd [cafl_reduction=mean]"] * 2
    assert plan.rows == "fedfd [cafl_reduction=mean]"


def test_a_list_option_off_the_paper_is_one_word_of_the_label():
    from raydg.labels import not_paper

    cfg = resolve(RunConfig(dataset="pacs", method="fedfd",
                            options={"eval_modes": ["global", "fixed"]}))
    assert not_paper(cfg) == 'eval_modes=["global","fixed"]'


def test_warnings_name_what_makes_a_weak_or_slow_partition_workable():
    """1500 clients of 10 images each: each holds 1 validation image (val_fraction 0.1), and
    all of them would validate every round; the warnings name the options that help."""
    from raydg.datasets import load_dataset
    from raydg.plan import check_federations

    data = load_dataset("digits-style", None, None, log=lambda _: None)
    cfg = RunConfig(dataset="digits-style", target="sketch", clients=1500, client_size=10)
    warnings = check_federations(plan_experiment(cfg), data)
    assert len(warnings) == 2
    assert warnings[0].startswith("1500 clients validate every round") and (
        "--validate-clients sampled" in warnings[0])
    assert warnings[1].startswith("1500 client(s) over the federations hold fewer than 5")
    sampled = RunConfig(dataset="digits-style", target="sketch", clients=1500, client_size=10,
                        validate_clients="sampled")
    assert len(check_federations(plan_experiment(sampled), data)) == 1


def test_an_experiment_is_named_by_what_differs_from_the_defaults():
    """The parent run's name: the search first (MLflow's runs table cuts names), then rows,
    the settings off the dataset's defaults (a value equal to the default is not named) and
    the dataset."""
    assert plan_experiment(RunConfig(dataset="digits-style", method="fedprox",
                                     lr=DATASETS.get("digits-style").defaults.lr)
                           ).name == "fedprox digits-style"
    grid = plan_experiment(RunConfig(dataset="digits-style", method="fedprox", clients=12,
                                     dirichlet=0.5, options={"mu": 0.1}),
                           Search(grid={"lr": [0.01, 0.1]}))
    assert grid.changed == "clients=12 dirichlet=0.5"
    assert grid.name == ("grid lr (2 settings): fedprox [mu=0.1] clients=12 dirichlet=0.5 "
                         "digits-style")
    random = plan_experiment(RunConfig(dataset="digits-style", method="fedprox"),
                             Search(space={"lr": {"uniform": [0.01, 0.1]}}, samples=3))
    assert random.name == "random lr (3 settings): fedprox digits-style"  # apart from the grid
