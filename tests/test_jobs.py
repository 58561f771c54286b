"""The scripts in jobs/ against recording stand-ins for ``ray`` and ``python`` (no Ray):
arguments reach raydg exactly, jobs are recorded, a failed submission stops a table with what
was and was not submitted listed, the smoke check goes to every node type."""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# a stand-in for a command: records its arguments and environment, one JSON line per call, and
# fails (exit 1) on the call numbered FAIL_AT
RECORDER = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["RECORD"]
calls = sum(1 for _ in open(log)) if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write(json.dumps({"argv": [os.path.basename(sys.argv[0])] + sys.argv[1:],
                        "env": dict(os.environ)}) + "\\n")
if calls + 1 == int(os.environ.get("FAIL_AT", 0)):
    sys.exit("refused by the stand-in")
print(os.environ.get("ANSWER_" + "_".join(sys.argv[1:3]).replace("-", "_"), ""))
"""


def stand_ins(tmp_path: Path, *names: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in names:
        path = bin_dir / name
        path.write_text(RECORDER)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "RECORD": str(tmp_path / "calls.jsonl"), "RAYDG_JOBS_LOG": str(tmp_path / "jobs.tsv")}


def calls(tmp_path: Path) -> list[dict]:
    path = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(args: list[str], env: dict[str, str], timeout: float = 60,
        **kw) -> subprocess.CompletedProcess:
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, **kw)


def test_submit_passes_arguments_exactly_and_records_the_job(tmp_path):
    env = stand_ins(tmp_path, "ray", "python")
    for name in ("RAYDG_STORAGE", "RAYDG_DATA_ROOT", "MLFLOW_TRACKING_URI", "RAYDG_MLFLOW_DB"):
        env.pop(name, None)
    env["RAYDG_MLFLOW_BACKUPS"] = "s3://b/backups"
    env["RAY_AUTH_TOKEN"] = "0123abcd\r"  # as captured from an SSH terminal
    args = ["run", "digits-style", "--experiment", "two words", "--set", "options.note=a 'b' $c"]
    done = run([str(ROOT / "jobs/submit.sh"), *args[:2], "--address=http://head:8265",
                 *args[2:]], env)
    assert done.returncode == 0, done.stderr
    (submit,) = calls(tmp_path)
    argv = submit["argv"]
    assert argv[:6] == ["ray", "job", "submit", "--address", "http://head:8265", "--no-wait"]
    job_id = argv[argv.index("--submission-id") + 1]
    assert done.stdout.strip() == job_id
    sent = submit["env"]
    assert (sent["RAY_AUTH_TOKEN"], sent["RAY_AUTH_MODE"]) == ("0123abcd", "token")
    runtime_env = json.loads(argv[argv.index("--runtime-env-json") + 1])
    assert runtime_env["env_vars"] == {"RAYDG_MLFLOW_BACKUPS": "s3://b/backups",  # set here
                                       "RAY_JOB_STOP_WAIT_TIME_S": "120"}  # the stop's grace
    # Ray quotes the words after "--" with shlex.join and runs them with a shell in the
    # working dir (ray/dashboard/modules/job/cli.py)
    entrypoint = shlex.join(argv[argv.index("--") + 1:])
    env["RAYDG_MLFLOW_BACKUPS"] = ""
    ran = run(["sh", "-c", entrypoint], env, cwd=ROOT)
    assert ran.returncode == 0, ran.stderr
    assert calls(tmp_path)[1]["argv"] == ["python", "-m", "raydg", *args]
    (line,) = (tmp_path / "jobs.tsv").read_text().splitlines()
    recorded_id, _, address, command = line.split("\t")
    assert (recorded_id, address, shlex.split(command)) == (job_id, "http://head:8265", args)


@pytest.mark.parametrize(("command", "backed_up"), [("run", True), ("doctor", False)])
def test_the_entrypoint_backs_up_the_store_after_commands_that_log_runs(tmp_path, command,
                                                                        backed_up):
    env = stand_ins(tmp_path, "python")
    env.update(RAYDG_MLFLOW_DB="/head/mlflow.db", RAYDG_MLFLOW_BACKUPS="s3://b/backups")
    done = run(["bash", str(ROOT / "jobs/entrypoint.sh"), command, "digits-style"], env)
    assert done.returncode == 0, done.stderr
    argvs = [c["argv"] for c in calls(tmp_path)]
    backup = ["python", "-m", "raydg", "store", "backup", "/head/mlflow.db", "s3://b/backups"]
    assert argvs == [["python", "-m", "raydg", command, "digits-style"]] + [backup] * backed_up


def test_a_failed_backup_fails_a_finished_job(tmp_path):
    env = stand_ins(tmp_path, "python")
    env.update(RAYDG_MLFLOW_DB="/head/mlflow.db", RAYDG_MLFLOW_BACKUPS="s3://b/x", FAIL_AT="2")
    done = run(["bash", str(ROOT / "jobs/entrypoint.sh"), "run", "digits-style"], env)
    assert done.returncode == 1 and "NOT backed up" in done.stderr


def test_a_table_that_fails_midway_lists_what_was_and_was_not_submitted(tmp_path):
    env = stand_ins(tmp_path, "ray")
    env["FAIL_AT"] = "3"  # the third submission is refused
    done = run([str(ROOT / "jobs/gperxan-tables.sh"), "--seed", "0"], env)
    assert done.returncode == 1
    ids = [line.split("\t")[0] for line in (tmp_path / "jobs.tsv").read_text().splitlines()]
    assert len(ids) == 2
    said = done.stderr
    assert "job 3 of 3 was not submitted: run --config configs/gperxan-camelyon17.yaml" in said
    submitted, not_submitted = said.split("submitted before it")[1].split("not submitted:")
    assert [line.split()[0] for line in submitted.strip().splitlines()[1:]] == ids
    assert "gperxan-pacs.yaml" in submitted and "gperxan-officehome.yaml" in submitted
    assert not_submitted.strip() == "run --config configs/gperxan-camelyon17.yaml " \
                                    "--gpus-per-actor 0.25"


TABLES = sorted(p.name for p in (ROOT / "jobs").glob("*.sh")
                if p.name not in ("submit.sh", "entrypoint.sh", "lib.sh", "token.sh"))


@pytest.mark.parametrize("script", TABLES)
def test_each_table_script_plans_jobs_whose_files_exist(script, tmp_path):
    env = {**stand_ins(tmp_path, "ray"), "RAYDG_DRY_RUN": "1"}
    done = run([str(ROOT / "jobs" / script), "--address=http://h:1", "--seed", "0"], env)
    assert done.returncode == 0, done.stderr
    jobs = [shlex.split(line) for line in done.stdout.splitlines()]
    assert jobs and not calls(tmp_path)  # planned, nothing submitted
    for words in jobs:
        assert words[-3:] == ["--address=http://h:1", "--seed", "0"]  # passed on to each job
        files = [w for w in words if w.endswith(".yaml")]
        assert all((ROOT / f).is_file() for f in files), files


@pytest.mark.parametrize(("config", "types"), [
    ("cluster.yaml", [("head", 0), ("gpu-1", 1), ("gpu-4", 4), ("cpu", 0)]),
    ("deploy/k8s/raycluster.yaml", [("head", 0), ("gpu", 1), ("cpu", 0)]),
])
def test_smoke_places_one_doctor_job_on_each_node_type_with_its_gpus(config, types, tmp_path):
    env = {**stand_ins(tmp_path, "ray"), "RAYDG_DRY_RUN": "1"}
    given = [] if config == "cluster.yaml" else ["--cluster", str(ROOT / config)]  # default
    done = run([str(ROOT / "jobs/smoke.sh"), *given], env)
    assert done.returncode == 0, done.stderr
    expected = [["doctor", "--gpus", str(gpus), "--entrypoint-num-gpus", str(gpus),
                 "--entrypoint-resources", json.dumps({f"raydg-node-{name}": 1})]
                for name, gpus in types]
    assert [shlex.split(line) for line in done.stdout.splitlines()] == expected


def test_smoke_refuses_a_node_type_without_its_marker(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump({"available_node_types": {"gpu": {"resources": {"GPU": 1}}}}))
    done = run([str(ROOT / "jobs/smoke.sh"), "--cluster", str(config)],
               {**stand_ins(tmp_path, "ray"), "RAYDG_DRY_RUN": "1"})
    assert done.returncode != 0 and "node type gpu has no raydg-node-TYPE resource" in done.stderr
    assert not done.stdout


def test_token_makes_the_clusters_token_once_and_points_the_job_client_at_it(tmp_path):
    """Before the first ``ray up``: a token made here (mode 600), which cluster.yaml mounts on
    every node; later calls keep it, so every ``ray up`` gives the nodes the same one."""
    env = {**os.environ, "HOME": str(tmp_path)}
    first = run([str(ROOT / "jobs/token.sh")], env, cwd=ROOT)
    token = tmp_path / ".ray" / "raydg-raydg.token"
    assert first.returncode == 0 and first.stdout == f"export RAY_AUTH_TOKEN_PATH={token}\n"
    made = token.read_text()
    assert len(made) == 64 and stat.S_IMODE(token.stat().st_mode) == 0o600
    again = run([str(ROOT / "jobs/token.sh")], env, cwd=ROOT)
    assert again.stdout == first.stdout and token.read_text() == made and not again.stderr
    mounts = yaml.safe_load((ROOT / "cluster.yaml").read_text())["file_mounts"]
    assert mounts["~/.ray/auth_token"] == "~/.ray/raydg-raydg.token"
