"""Benchmark scripts' own logic on hand-made inputs (their runs are measurements, not tests)."""

from __future__ import annotations

from raydg.config import RunConfig
from tests.conftest import load_benchmark


def _rows(method: str, mode: str, accs: list[float]) -> list[dict]:
    return [{"method": method, "mode": mode, "selection": s, "target": f"T{i}", "seed": 0,
             "accuracy": a if s == "selected" else 99.0}
            for i, a in enumerate(accs) for s in ("selected", "last")]


def test_defaults_flags_a_row_within_the_margin_of_chance_by_its_first_mode():
    defaults = load_benchmark("defaults")
    rows = (_rows("fedavg", "global", [40.0, 30.0]) + _rows("fedfd", "global", [12.0, 13.0])
            + _rows("fedfd", "fixed", [60.0, 60.0]) + _rows("csac", "global", [16.0, 14.0]))
    lines, collapsed = defaults.table(rows, chance=10.0, margin=5.0)
    assert lines[2:] == ["| fedavg | 35.00 | +0.00 | yes |",
                         "| fedfd | 12.50 | -22.50 | COLLAPSED |",  # its reported mode
                         "| csac | 15.00 | -20.00 | COLLAPSED |"]  # not above 10 + 5
    assert collapsed == 2


def test_defaults_lists_what_a_datasets_model_cannot_run_with_raydgs_error():
    runnable, refused = load_benchmark("defaults").grid(RunConfig(dataset="rotmnist"))
    assert {"method": "fedavg"} in runnable and {"method": "csac"} in runnable
    assert set(refused) >= {"fedbn", "silobn", "fedfd", "fedfd-a", "gperxan"}
    assert "mnist-cnn-bn" in refused["fedbn"]
