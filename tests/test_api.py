"""The Python API: the docs' example (two methods, their paired difference from the returned
tables, the same as ``raydg report --versus``), the tables against the printed ones, a report
read from the store, and Ctrl-C in a script: the experiment stops, no Ray process is left, and
``raydg.resume`` finishes it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

import raydg
from raydg.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def readme_example() -> str:
    """The Python block of the "Python API" section of docs/extending.md."""
    section = (ROOT / "docs" / "extending.md").read_text().split("## Python API", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.slow
def test_the_docs_example_trains_shows_progress_and_prints_what_raydg_report_prints(
        ray_session, capsys):
    """The example shows its progress, both methods learn (every seed at least twice chance
    on the held-out domain), and its paired difference is `raydg report --versus`'s."""
    exec(compile(readme_example(), "docs/extending.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "[sketch seed=0] round 1/10 loss " in printed and "round 10/10" in printed
    table = printed.split("method  fedavg  fedbn", 1)[1].split("fedbn vs fedavg")[0]
    per_seed = [line.split() for line in table.strip().splitlines()[1:]]  # under "seed"
    assert [int(row[0]) for row in per_seed] == [0, 1, 2]
    assert all(float(acc) >= 20.0 for row in per_seed for acc in row[1:]), per_seed
    ours = re.search(r"fedbn vs fedavg: ([+-]\d+\.\d\d ± \d+\.\d\d) over 3 seeds", printed)
    assert ours, printed
    report = CliRunner().invoke(cli, ["report", "--experiment", "api-demo", "--versus",
                                      "fedavg"])
    assert report.exit_code == 0, report.output
    fedbn, = (line for line in report.stdout.splitlines() if line.startswith("fedbn "))
    assert fedbn.split()[-3:] == ours.group(1).split(), (fedbn, ours.group(1))


@pytest.mark.slow
def test_results_tables_hold_the_printed_numbers(ray_session):
    result = raydg.run("digits-style", method="fedfd-a", target="sketch", seeds=[0, 1],
                       rounds=1, local_steps=2, experiment="api-tables")
    rows = result.rows.to_pylist()
    modes = ["adapter", "global", "instance", "fixed", "random"]  # fedfd-a's, adapter first
    assert len(rows) == 2 * len(modes) * 3  # seeds x modes x selections
    assert {r["mode"] for r in rows if r["primary"]} == {"adapter"}
    summary = {(s["mode"], s["selection"]): s for s in result.summary.to_pylist()}
    for (mode, selection), s in summary.items():
        mine = [r["accuracy"] for r in rows if (r["mode"], r["selection"]) == (mode, selection)]
        assert abs(s["sketch"] - sum(mine) / 2) < 1e-9
    selected = summary[("adapter", "selected")]
    assert f"{selected['sketch']:.2f} ± {selected['sketch_std']:.2f}" in result.printed
    stored = raydg.read_report(experiment="api-tables").to_pylist()
    assert sorted(r["accuracy"] for r in stored) == sorted(
        r["accuracy"] for r in rows if r["primary"] and r["selection"] == "selected")


SCRIPT = """
import raydg, sys
try:
    raydg.run("digits-style", target="sketch", rounds=30, local_steps=20, clients=3,
              tracking_uri=sys.argv[1], storage=sys.argv[2], progress="lines", out=print)
except raydg.Interrupted as stop:
    print("interrupted:", stop.experiment_dir, flush=True)
    sys.exit(130)
"""
RESUME = """
import json, raydg, sys
result = raydg.resume(sys.argv[1])
print(json.dumps({"run_id": result.run_id, "rows": result.rows.to_pylist()}))
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_experiment_and_leaves_no_ray_process(tmp_path):
    """A script's Ctrl-C (SIGINT to the Python process, as a notebook's interrupt) while
    rounds run: ``raydg.Interrupted``, then no process of the Ray it started is left; another
    script's ``raydg.resume(experiment_dir)`` finishes the experiment into its MLflow run."""
    script = tmp_path / "run.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen([sys.executable, str(script), f"sqlite:///{tmp_path}/mlflow.db",
                             str(tmp_path / "results")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    lines = []
    for line in proc.stdout:  # until the first round is done
        lines.append(line)
        if "round 1/30" in line:
            break
    ray_processes = psutil.Process(proc.pid).children(recursive=True)
    assert ray_processes, "".join(lines)
    proc.send_signal(signal.SIGINT)
    start = time.monotonic()
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=120) == 130, "".join(lines)[-3000:]
    print(f"stopped {time.monotonic() - start:.1f} s after SIGINT")
    folder, = (line.split(": ", 1)[1].strip() for line in lines
               if line.startswith("interrupted: "))
    assert (Path(folder) / "raydg.json").is_file()  # what `raydg resume FOLDER` continues
    _, alive = psutil.wait_procs(ray_processes, timeout=30)
    assert not alive, [(p.pid, p.name()) for p in alive]
    script.write_text(textwrap.dedent(RESUME))
    resumed = subprocess.run([sys.executable, str(script), folder], capture_output=True,
                             text=True, cwd=tmp_path, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    answer = json.loads(resumed.stdout.splitlines()[-1])
    assert answer["run_id"] == json.loads((Path(folder) / "raydg.json").read_text())["run_id"]
    last = [r for r in answer["rows"] if r["selection"] == "last"]
    assert [(r["target"], r["seed"], r["round"]) for r in last] == [("sketch", 0, 30)]


def test_a_bad_search_or_progress_is_one_error_before_anything_runs():
    """The API checks a search as a sweep file's is (a string is not a list of values) and
    names the progress modes; nothing starts."""
    import pytest

    from raydg.errors import RaydgError

    bad = {"search": {"grid": {"lr": "abc"}}, "progress": "bogus"}
    with pytest.raises(RaydgError, match=r"search key 'lr' needs a non-empty list of values, "
                                         r"got 'abc'"):
        raydg.run("digits-style", search=bad["search"])
    with pytest.raises(RaydgError, match="search takes the keys grid, random, space, samples, "
                                         "seed, not"):
        raydg.run("digits-style", search={"grids": {"lr": [0.1]}})
    with pytest.raises(RaydgError, match="progress must be one of lines, live, none, not "
                                         "'bogus'"):
        raydg.run("digits-style", progress=bad["progress"])
