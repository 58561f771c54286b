"""Runs kept in a file: MLflow child runs exported to gzip JSON, read back like the store.

``raydg report --export FILE`` writes the runs a report matched; ``raydg report --rows FILE``
reads them instead of a store, so that a page regenerates from files committed in the
repository, without the store (and the machine) that ran the experiments. A file holds, per
run, its experiment, status, start and end times, the ``raydg.*`` tags, params, final metrics
and the history of every metric; never weights or artifacts. :class:`StoredRuns` answers the
part of ``MlflowClient`` that the report uses, with the filters ``raydg report --filter`` is
documented with (``params.K = 'V'``, ``tags.K != 'V'``, ``attributes.status = 'V'``, joined
by ``and``). Files are plain JSON: nothing is unpickled.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from raydg.errors import RaydgError

FORMAT = "raydg-runs/1"
KEPT_TAGS = ("mlflow.parentRunId", "mlflow.runName")
CONDITION = re.compile(r"\s*(params|tags|attributes)\.(`[^`]+`|[\w.\-/]+)\s*(!=|=)\s*'([^']*)'\s*",
                       re.IGNORECASE)


def export(client: Any, runs: Sequence[Any], path: Path, about: dict[str, Any]) -> int:
    """Write ``runs`` (MLflow runs of ``client``'s store) and ``about`` (what made them: command,
    machine) to ``path``; the same runs give the same bytes. Returns the number of runs."""
    names = {e.experiment_id: e.name for e in client.search_experiments()}
    records = [{
        "experiment": names[r.info.experiment_id], "run_id": r.info.run_id,
        "status": r.info.status, "start_time": r.info.start_time, "end_time": r.info.end_time,
        "tags": {k: v for k, v in r.data.tags.items()
                 if k.startswith("raydg.") or k in KEPT_TAGS},
        "params": dict(r.data.params), "metrics": dict(r.data.metrics),
        "history": {k: _history(client, r.info.run_id, k) for k in r.data.metrics}}
        for r in runs]
    text = json.dumps({"format": FORMAT, "about": about, "runs": records}, sort_keys=True,
                      separators=(",", ":"))
    path.parent.mkdir(parents=True, exist_ok=True)
    # no name or time in the gzip header: the same runs give the same bytes
    with open(path, "wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as out:
        out.write(text.encode())
    return len(records)


def _history(client: Any, run_id: str, key: str) -> list[list[float]]:
    """[[step, value], ...] in the order logged (a step logged twice, e.g. by a restored
    trial, keeps both)."""
    found = client.get_metric_history(run_id, key)
    return [[m.step, m.value] for m in sorted(
        found, key=lambda m: (m.step, getattr(m, "timestamp", 0)))]


def load(path: Path) -> dict[str, Any]:
    """The contents of an exported file; :class:`RaydgError` if it is not one."""
    try:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise RaydgError(f"{path}: not a raydg runs file ({err})") from None
    if data.get("format") != FORMAT:
        raise RaydgError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
    return data


def conditions(filter_string: str) -> list[tuple[str, str, str, str]]:
    """``params.rounds = '10' and tags.`raydg.mode` != 'global'`` ->
    ``[("params", "rounds", "=", "10"), ("tags", "raydg.mode", "!=", "global")]``."""
    if not filter_string.strip():
        return []
    out = []
    for part in re.split(r"\s+and\s+", filter_string.strip(), flags=re.IGNORECASE):
        match = CONDITION.fullmatch(part)
        if match is None:
            raise RaydgError(f"--filter {filter_string!r}: a runs file takes conditions "
                             "params.K = 'V', tags.K = 'V' or attributes.status = 'V' (or !=) "
                             "joined by 'and'")
        kind, key, op, value = match.groups()
        out.append((kind.lower(), key.strip("`"), op, value))
    return out


class StoredRuns:
    """The runs of exported files, behind the calls ``raydg report`` makes to ``MlflowClient``
    (an experiment's id is its name)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.files = [load(Path(p)) for p in paths]
        self.tracking_uri = "runs file(s) " + ", ".join(map(str, paths))
        self.runs = [self._run(r) for f in self.files for r in f["runs"]]
        self.history = {r["run_id"]: r["history"] for f in self.files for r in f["runs"]}

    @staticmethod
    def _run(r: dict[str, Any]) -> SimpleNamespace:
        info = SimpleNamespace(run_id=r["run_id"], status=r["status"],
                               experiment_id=r["experiment"], start_time=r["start_time"],
                               end_time=r["end_time"])
        return SimpleNamespace(info=info, data=SimpleNamespace(
            tags=r["tags"], params=r["params"], metrics=r["metrics"]))

    def search_experiments(self) -> list[SimpleNamespace]:
        names = dict.fromkeys(r.info.experiment_id for r in self.runs)
        return [SimpleNamespace(experiment_id=n, name=n) for n in names]

    def get_experiment_by_name(self, name: str) -> SimpleNamespace | None:
        return next((e for e in self.search_experiments() if e.name == name), None)

    def search_runs(self, experiment_ids: Sequence[str], filter_string: str = "",
                    **_: Any) -> list[SimpleNamespace]:
        """The runs of those experiments that meet every condition, oldest first (the order
        ``raydg report`` asks the store for)."""
        wanted = conditions(filter_string)

        def value(run: SimpleNamespace, kind: str, key: str) -> str | None:
            if kind == "attributes":
                return str(getattr(run.info, key, None))
            return getattr(run.data, kind).get(key)

        found = [r for r in self.runs if r.info.experiment_id in experiment_ids
                 and all((value(r, kind, key) == v) == (op == "=")
                         for kind, key, op, v in wanted)]
        return sorted(found, key=lambda r: r.info.start_time)

    def get_metric_history(self, run_id: str, key: str) -> list[SimpleNamespace]:
        return [SimpleNamespace(step=s, value=v) for s, v in self.history[run_id].get(key, [])]
