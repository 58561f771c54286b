"""``raydg report`` on runs files (``--export``, then ``--rows``) of the store that
tests/report_runs.py writes: the same answers as the store, what a file cannot answer, page
templates filled from files, and rows and cells with fewer seeds than the table's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from mlflow import MlflowClient

from raydg.cli import cli
from raydg.errors import RaydgError
from raydg.reporting import pages, rows
from tests.report_runs import (
    METHODS,
    SEEDS,
    TARGETS,
    child_runs,
    expected_table,
    paired_interval,
    report,
    run_accuracies,
)

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out


@pytest.fixture
def store(report_store: str) -> str:
    """The runs of ``write_runs``, written once for the test session (tests/conftest.py)."""
    return report_store


def test_a_runs_file_reports_what_its_store_does(store, tmp_path):
    """``--export`` then ``--rows``: the same tables, per-round blocks, filters and pairing as
    the store gives; the file holds every child run with its histories, in the same bytes
    when exported again."""
    path = tmp_path / "runs.json.gz"
    args = ["--versus", "fedavg", "--per-round", "val_acc", "--format", "markdown"]
    exported = report(store, "--export", str(path), *args)
    assert exported.exit_code == 0, exported.output
    data = rows.load(path)
    children = child_runs(store)
    assert sorted(r["run_id"] for r in data["runs"]) == sorted(r.info.run_id for r in children)
    one = children[0]
    assert dict(map(tuple, next(r for r in data["runs"] if r["run_id"] == one.info.run_id)
                    ["history"]["val_acc"])) == {m.step: m.value for m in MlflowClient(
                        store).get_metric_history(one.info.run_id, "val_acc")}
    for extra in ([], ["--filter", "params.lr = '0.5'"],
                  ["--filter", "params.lr != '0.5' and tags.`raydg.target` = 'M0'"]):
        from_rows = CliRunner().invoke(cli, ["report", "--rows", str(path), *args, *extra])
        assert from_rows.exit_code == 0, from_rows.output
        assert from_rows.stdout == report(store, *args, *extra).stdout
    again = tmp_path / "again.json.gz"
    assert report(store, "--export", str(again), *args).exit_code == 0
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize(("args", "message"), [
    (["--filter", "metrics.val_acc > 0.5"], "a runs file takes conditions"),
    (["--tracking-uri", "sqlite:///x.db"], "drop --tracking-uri"),
    (["--ledger"], "does not hold"),
])
def test_a_runs_file_refuses_what_it_cannot_answer(store, tmp_path, args, message):
    path = tmp_path / "runs.json.gz"
    assert report(store, "--export", str(path)).exit_code == 0
    result = CliRunner().invoke(cli, ["report", "--rows", str(path), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_page_template_is_filled_from_runs_files(store, tmp_path):
    """A ``report`` block becomes its command and tables; references become its numbers,
    which are the ones computed here from the runs' histories; a missing runs file says so;
    an unknown method is an error, not a blank."""
    assert report(store, "--export", str(tmp_path / "two.json.gz"),
                  "--filter", "params.lr != '0.5'").exit_code == 0
    template = ("```report\nid: q\nrows: two\nversus: fedavg\nper_round: [val_acc]\n```\n"
                "FedBN {{q | fedbn | Avg}} ({{q | fedbn | vs fedavg (95% CI)}}), round 2 "
                "{{q | fedavg | val_acc round 2}}.\n"
                "```report\nid: later\nrows: absent\nmake: python make.py x\n```\n"
                "{{later | fedavg | Avg}}\n")
    page = pages.render(template, tmp_path)
    expected = expected_table(store, "selected", "0.05")
    mean, half = paired_interval(expected, "fedbn", "fedavg")
    client = MlflowClient(store)
    val2 = np.mean([m.value for r in child_runs(store, "0.05", "fedavg")
                    for m in client.get_metric_history(r.info.run_id, "val_acc") if m.step == 2])
    assert (f"FedBN {expected['fedbn']['Avg']:.2f} ({mean:+.2f} ± {half:.2f}), round 2 "
            f"{val2:.4g}.") in page
    assert page.startswith(f"```\nraydg report --rows {tmp_path / 'two.json.gz'} --versus "
                           "fedavg --per-round val_acc --format markdown\n```\n\n**Accuracy")
    assert (f"*Not yet run:* `{tmp_path / 'absent.json.gz'}` is missing; `python make.py x` "
            "makes it.\n(not yet run)\n") in page
    with pytest.raises(RaydgError, match="0 rows of method 'fedprox'"):
        pages.render(template.replace("q | fedbn | Avg", "q | fedprox | Avg"), tmp_path)


def _report_without(store: str, tmp_path, drop, *args: str) -> str:
    """``raydg report --rows FILE ARGS`` on a runs file of the store's lr 0.05 runs less those
    whose tags ``drop`` picks: its output (which must succeed, without a warning)."""
    import gzip

    full = tmp_path / "runs.json.gz"
    if not full.exists():
        assert report(store, "--filter", "params.lr = '0.05'", "--export", str(full)
                      ).exit_code == 0
    data = json.loads(gzip.decompress(full.read_bytes()))
    data["runs"] = [r for r in data["runs"] if not drop(r["tags"])]
    fewer = tmp_path / "fewer.json.gz"
    fewer.write_bytes(gzip.compress(json.dumps(data).encode()))
    result = CliRunner().invoke(cli, ["report", "--rows", str(fewer), *args])
    assert result.exit_code == 0 and "Warning" not in result.output, result.output
    return result.stdout


def test_rows_with_fewer_seeds_say_so(store, tmp_path):
    """fedbn's seed 1 runs left out of a runs file: its row has one seed (no ± 0.00), the
    table says 1-2 seeds and gains a Seeds column."""
    lines = _report_without(store, tmp_path, lambda t: (t.get("raydg.method"), t.get(
        "raydg.seed")) == ("fedbn", "1")).splitlines()
    assert lines[0].endswith("selected round (training-domain validation), mean ± std over 1-2 "
                             "seeds (Avg: of the per-seed means over the targets); Seeds: per "
                             "row"), lines[0]
    assert lines[1].split() == ["Method", *TARGETS, "Avg", "Seeds"]
    fedavg, fedbn = (next(line.split() for line in lines if line.startswith(m + " "))
                     for m in METHODS)
    assert fedavg[-1] == "2" and "±" in fedavg and fedbn[-1] == "1" and "±" not in fedbn


@pytest.mark.parametrize("seeds", [("1",), ("0", "1")])
def test_a_domain_without_every_seed_is_shown_as_it_is_and_avg_only_over_whole_seeds(
        store, tmp_path, seeds):
    """fedbn's M45 runs of ``seeds`` left out. Seed 1: its M45 cell is seed 0's accuracy alone
    (no ± 0.00), its Avg and its difference to FedAvg those of seed 0, which has both domains,
    each marked as over 1 seed of the row's 2 (the heading says what the mark means). Both:
    M45, Avg and the difference are empty (—; null in JSON, — where a page cites it): never an
    average over fewer domains than the table's."""
    def drop(tags: dict[str, str]) -> bool:
        return (tags.get("raydg.method"), tags.get("raydg.target")) == ("fedbn", "M45") \
            and tags.get("raydg.seed") in seeds

    lines = _report_without(store, tmp_path, drop, "--versus", "fedavg").splitlines()
    line = next(ln for ln in lines if ln.startswith("fedbn "))
    cells = [c.strip() for c in line.split("  ") if c.strip()][1:]
    record = next(r for r in json.loads(_report_without(store, tmp_path, drop, "--format",
                                                        "json")) if r["method"] == "fedbn")
    acc = run_accuracies(store, "selected", "0.05")
    m0 = [acc["fedbn", "M0", s] for s in SEEDS]
    assert cells[0] == f"{np.mean(m0):.2f} ± {np.std(m0, ddof=1):.2f}"  # both seeds, always
    if len(seeds) == 2:
        assert cells[1:] == ["—", "—", "—"] and record["M45"] is None and record["Avg"] is None
        assert pages.value([record], "fedbn", "Avg", "a page") == "—"
        return
    avg0 = np.mean([acc["fedbn", "M0", 0], acc["fedbn", "M45", 0]])
    versus0 = avg0 - np.mean([acc["fedavg", "M0", 0], acc["fedavg", "M45", 0]])
    assert cells[1:] == [f"{acc['fedbn', 'M45', 0]:.2f} (1)", f"{avg0:.2f} (1)",
                         f"{versus0:+.2f} (1 seed)"]
    assert lines[0].endswith("mean ± std over 2 seeds (Avg: of the per-seed means over the "
                             "targets); (n): a cell over n seeds, fewer than its row's")
    assert record["Avg"] == pytest.approx(avg0)
    assert (record["M0_seeds"], record["M45_seeds"], record["Avg_seeds"]) == (2, 1, 1)
