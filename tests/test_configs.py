"""Every file in configs/ loads, resolves (no data needed) and starts with a comment.

A config named ``<paper>-<dataset>.yaml`` after one of the method papers must also start with a
comment block naming that paper and a table or figure, run that dataset and that paper's
method, and rely on the method defaults that stand for the paper's values (pinned below, so a
changed default cannot silently change a reproduction). The embedded-benchmark configs
(digits-*.yaml, fedfd-digits-style.yaml) are not paper reproductions and only need a comment.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from raydg.config import RunConfig, apply, split_search
from raydg.config_files import load_yaml
from raydg.datasets import DATASETS
from raydg.errors import RaydgError
from raydg.methods import method_class
from raydg.planning import plan_experiment
from raydg.resolve import resolve

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
FILES = sorted(CONFIGS.glob("*.yaml"))

# file-name prefix -> (how the header names the paper, the methods a config may run)
PAPERS = {
    "fedfd-a": ("FedFD-A", {"fedfd-a"}),
    "fedig-a": ("FedIG-A", {"fedfd-a"}),  # fedig-a is an alias of fedfd-a
    "gperxan": ("gPerXAN", {"gperxan"}),
    "csac": ("CSAC", {"csac"}),
    "ccst": ("CCST", {"ccst"}),
    "ga": ("FedDG-GA", {"ga"}),  # an aggregation rule: --aggregation ga
}
TABLE = re.compile(r"\b(Table \d+|Fig\. \d+)")
HEADER_LINES = 6

# resolved options that stand for the paper's values (see each config's comment block)
PINNED = {
    "fedfd-a": {"lambda1": 0.1, "lambda2": 4.0, "u_low": 0.0, "u_high": 1.0, "base": "silobn",
                "objective": "fedfd-a", "adapter_alpha": "scalar"},
    "fedig-a": {"lambda1": 0.1, "lambda2": 4.0, "u_low": 0.0, "u_high": 1.0, "base": "silobn",
                "objective": "fedig"},
    "gperxan": {"lambda_reg": 0.5, "norm": "xan"},
    "csac": {"lambda_cal": 0.6, "label_smoothing": 0.1, "distance": "l2"},
    "ccst": {"k": 3, "style": "overall"},
    "ga": {"step_size": 0.2, "metric": "loss", "centre": True},
}


def paper_of(path: Path) -> tuple[str, str] | None:
    """(paper key, rest of the name) for ``<paper>-<rest>.yaml``, else None."""
    for key in sorted(PAPERS, key=len, reverse=True):
        if path.stem.startswith(f"{key}-"):
            return key, path.stem[len(key) + 1:]
    return None


def header(path: Path) -> str:
    """The leading comment block (at most HEADER_LINES lines)."""
    lines = []
    for line in path.read_text().splitlines()[:HEADER_LINES]:
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# "))
    return " ".join(lines)


def loaded(path: Path) -> RunConfig:
    return resolve(apply(RunConfig(), split_search(load_yaml(path))[0]))


def test_there_are_paper_configs():
    found = {p[0] for p in map(paper_of, FILES) if p}
    assert found == set(PAPERS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_loads_and_resolves(path: Path):
    cfg = loaded(path)  # resolve validates dataset, method, options and values
    assert cfg.dataset in DATASETS.names()
    assert cfg.rounds > 0 and cfg.local_steps > 0 and cfg.lr > 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_config_starts_with_a_comment(path: Path):
    assert header(path), f"{path.name} must start with a comment saying what it runs"


@pytest.mark.parametrize("path", [p for p in FILES if paper_of(p)], ids=lambda p: p.name)
def test_paper_config_matches_its_name_and_paper(path: Path):
    key, rest = paper_of(path)
    paper, methods = PAPERS[key]
    text = header(path)
    assert paper in text, f"{path.name}: the first lines must name {paper}"
    assert TABLE.search(text), f"{path.name}: the first lines must name a table or figure"
    raw = load_yaml(path)
    assert "method" in raw and "dataset" in raw, f"{path.name} must set dataset and method"
    cfg = loaded(path)
    assert methods & {cfg.method, cfg.augment, cfg.aggregation}, (
        f"{path.name} runs {cfg.label}, not {paper}'s method ({', '.join(sorted(methods))})")
    if rest in DATASETS.names():
        assert cfg.dataset == rest, f"{path.name} runs dataset {cfg.dataset}, not {rest}"
    options = dataclasses.asdict(method_class(cfg.method, cfg.augment, cfg.aggregation)
                                 .parse_options(cfg.options))
    for name, value in PINNED[key].items():
        assert options[name] == value, f"{path.name}: options.{name}"


def on_paper_data(path: Path) -> bool:
    """A paper config on the paper's own data (not an embedded stand-in such as digits-rot)."""
    return bool(paper_of(path)) and DATASETS.get(load_yaml(path)["dataset"]).needs_root


@pytest.mark.parametrize("path", [p for p in FILES if on_paper_data(p)], ids=lambda p: p.name)
def test_paper_config_sets_its_training_protocol(path: Path):
    """A reproduction states its protocol instead of inheriting dataset or raydg defaults."""
    raw = load_yaml(path)
    for key in ("seeds", "rounds", "local_steps", "lr", "momentum", "batch_size",
                "val_fraction", "model"):
        assert key in raw, f"{path.name} must set {key}"


SWEEPS = sorted(CONFIGS.glob("sweeps/*.yaml"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_sweep_file_plans_every_setting(path: Path):
    """A sweep file starts with a comment, defines a search, and every setting resolves."""
    assert header(path), f"{path.name} must start with a comment saying what it searches"
    values, search = split_search(load_yaml(path))
    assert search, f"{path.name} defines no grid or random search"
    plan = plan_experiment(apply(RunConfig(), values), search)
    assert len(plan.settings) > 1
    assert len(plan.federations) == len(plan.settings) * len(plan.targets) * len(
        plan.config.seeds)
    if "lambda" in path.stem:  # the FedFD-A lambda studies vary one weight, the other fixed
        (key,) = search.grid
        other = {"options.lambda1": "lambda2", "options.lambda2": "lambda1"}[key]
        fixed = {f.config.options.get(other) for f in plan.federations}
        assert fixed == {None}, f"{path.name} must keep {other} at the paper's default"


def test_pacs_table_sweep_runs_the_table_methods_under_one_protocol():
    values, search = split_search(load_yaml(CONFIGS / "sweeps" / "pacs-table.yaml"))
    plan = plan_experiment(apply(RunConfig(), values), search)
    methods = {f.config.method for f in plan.federations}
    assert {"fedavg", "fedprox", "fedbn", "silobn", "fedfd", "fedfd-a"} <= methods
    assert {(f.config.rounds, f.config.local_steps, f.config.lr) for f in plan.federations} == {
        (40, 200, 0.01)}
    assert {f.config.options.get("mu") for f in plan.federations
            if f.config.method == "fedprox"} == {0.1}


SCHEMA = CONFIGS.parent / "docs" / "config.schema.json"


def test_the_published_schema_is_current_and_every_config_file_meets_it():
    """docs/config.schema.json is what ``raydg schema`` prints; every ready-made config (and
    sweep) meets it, checked by jsonschema, which shares no code with raydg's own checks."""
    from click.testing import CliRunner
    from jsonschema import Draft202012Validator

    from raydg.cli import cli

    printed = CliRunner().invoke(cli, ["schema"])
    assert printed.exit_code == 0 and json.loads(printed.output) == json.loads(
        SCHEMA.read_text()), "docs/config.schema.json is stale: raydg schema > it"
    validator = Draft202012Validator(json.loads(SCHEMA.read_text()))
    for path in [*FILES, *sorted((CONFIGS / "sweeps").glob("*.yaml"))]:
        raw = yaml.safe_load(path.read_text())
        assert not list(validator.iter_errors(raw)), path.name
    # the four values the schema and raydg refuse alike, each in one line naming key and type
    for bad, message in (({"lr": True}, "config key 'lr' must be a finite number > 0 or null"),
                         ({"seeds": [1.5]}, "config key 'seeds[0]' must be integers from 0"),
                         ({"rounds": 0}, "config key 'rounds' must be an integer > 0 or null"),
                         ({"colour": 1}, "unknown config key 'colour'")):
        assert list(validator.iter_errors(bad)), bad
        with pytest.raises(RaydgError, match=re.escape(message)):
            apply(RunConfig(), bad)
