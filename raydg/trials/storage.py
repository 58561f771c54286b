"""An experiment's folder (local or a pyarrow filesystem URI): its name, its manifest for
``raydg resume``, and the checkpoints a resume will restore."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from ray import tune

from raydg import checkpoint
from raydg.config import RunConfig, Search
from raydg.errors import RaydgError
from raydg.plan import Federation, Plan
from raydg.trials import logs
from raydg.trials.trial import FEDERATION
from raydg.version import __version__


def check_storage(storage: str) -> None:
    """Refuse a storage location (local folder or pyarrow filesystem URI) that cannot be
    written, before anything starts."""
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(storage if "://" in storage else
                                            Path(storage).as_uri())
        probe = f"{path.rstrip('/')}/.raydg-write-test-{uuid.uuid4().hex}"
        fs.create_dir(path.rstrip("/") or "/", recursive=True)
        with fs.open_output_stream(probe) as f:
            f.write(b"ok")
        fs.delete_file(probe)
    except (OSError, ValueError, RuntimeError) as err:  # pyarrow raises OSError subclasses
        raise RaydgError(f"cannot write to --storage {storage}: {err}") from None


MANIFEST = "raydg.json"  # in the experiment's folder: what `raydg resume` needs


def experiment_dir(plan: Plan, run_id: str) -> str:
    """A new experiment's folder (or URI) under ``storage``, named after the dataset, the
    method(s), the time and the MLflow run."""
    label = re.sub(r"[^\w.+=-]+", "_", plan.label)
    name = f"{plan.config.dataset}-{label}-{time.strftime('%Y%m%d-%H%M%S')}-{run_id[:8]}"
    return f"{plan.runtime.storage.rstrip('/')}/{name}"


def _filesystem(path: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    return pafs.FileSystem.from_uri(path if "://" in path else Path(path).absolute().as_uri())


def write_manifest(directory: str, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` (with the raydg version that writes it) into ``directory``."""
    fs, path = _filesystem(directory)
    fs.create_dir(path, recursive=True)
    with fs.open_output_stream(f"{path}/{MANIFEST}") as f:
        f.write(json.dumps({**manifest, "raydg": __version__}, indent=1).encode())


def read_manifest(directory: str, resumable: bool = True) -> dict[str, Any]:
    """What an experiment was started with (its config, search and MLflow run); a one-line
    error naming the file if it is missing or unreadable, or (``resumable``) if another minor
    version of raydg wrote it (:func:`other_version`)."""
    where = f"{directory.rstrip('/')}/{MANIFEST}"
    try:
        fs, path = _filesystem(where)
        with fs.open_input_stream(path) as f:
            manifest = json.loads(f.read())
        if not {"run_id", "config", "search"} <= set(manifest):
            raise ValueError("keys run_id, config and search are missing")
    except (OSError, ValueError) as err:
        raise RaydgError(f"{where} is not a raydg experiment's manifest: {err}") from None
    other = other_version(manifest)
    if resumable and other:
        raise RaydgError(f"{where}: {other}")
    return manifest


def resumed(directory: str, tracking: str | None, address: str | None = None
            ) -> tuple[RunConfig, Search, dict[str, Any]]:
    """The config, search and manifest of the experiment in ``directory``; ``tracking``, when
    given, is where its MLflow store is now (the store moved), and ``address`` the Ray
    cluster to continue on (the experiment's is gone, or started again elsewhere)."""
    manifest = read_manifest(directory)
    cfg = RunConfig(**manifest["config"])
    cfg = dataclasses.replace(cfg, tracking_uri=tracking or cfg.tracking_uri,
                              address=address or cfg.address)
    return cfg, Search(**manifest["search"]), manifest


def resume_target(target: str, tracking: str | None = None) -> str:
    """The experiment folder that ``raydg resume TARGET`` continues: TARGET itself (a URI, or a
    local path in any form: relative, ``~``, absolute), or the folder recorded on the MLflow
    parent run whose id TARGET is."""
    if "://" in target:
        return target
    folder = Path(target).expanduser()
    if folder.exists() or not re.fullmatch(r"[0-9a-f]{32}", target):
        if not folder.is_dir():
            raise RaydgError(f"no experiment folder {target} (nor an MLflow run id): name the "
                             "folder raydg printed when the experiment started or stopped")
        return str(folder.resolve())
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from raydg.tracking.store import tracking_uri

    uri = tracking_uri(RunConfig(tracking_uri=tracking))
    try:
        tags = MlflowClient(uri).get_run(target).data.tags
    except MlflowException as err:
        raise RaydgError(f"no MLflow run {target} in {uri}: {err.message}") from None
    if "raydg.experiment_dir" not in tags:
        raise RaydgError(f"MLflow run {target} is not the parent run of a raydg experiment")
    return tags["raydg.experiment_dir"]


def other_version(manifest: dict[str, Any]) -> str | None:
    """Why this raydg cannot resume an experiment written by another minor version (its
    config, checkpoints and results may differ in form), or None."""
    wrote = manifest.get("raydg")
    if wrote is None:  # a manifest of raydg's development before 0.1.0
        return (f"the experiment was written by a raydg before 0.1.0 and this is raydg "
                f"{__version__}: run it again")
    if str(wrote).split(".")[:2] == __version__.split(".")[:2]:
        return None
    return (f"the experiment was written by raydg {wrote} and this is raydg {__version__}: "
            f"resume it with raydg {wrote}, or run it again")


def unfinished(storage: str) -> list[tuple[str, str]]:
    """The experiments under ``storage`` that ``raydg resume`` can continue, newest first:
    (folder, the status of its MLflow parent run: KILLED, FAILED, RUNNING when its process
    was killed, or why it could not be read); finished ones are left out."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(storage)
    folders = [i for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
               if i.type == pafs.FileType.Directory
               and fs.get_file_info(f"{i.path}/{MANIFEST}").type == pafs.FileType.File]
    out = []
    for info in sorted(folders, key=lambda i: i.mtime_ns or 0, reverse=True):
        folder = info.path if "://" not in storage else f"{storage.rstrip('/')}/{info.base_name}"
        manifest = read_manifest(folder, resumable=False)
        status = other_version(manifest) or _run_status(manifest)
        if status != "FINISHED":
            out.append((folder, status))
    return out


def _run_status(manifest: dict[str, Any]) -> str:
    """The status of an experiment's MLflow parent run, or why it cannot be read (a store
    moved or gone: the experiment is still listed, with why)."""
    from raydg.tracking.store import reading_client

    try:
        client = reading_client(manifest["config"].get("tracking_uri") or "")
        return client.get_run(manifest["run_id"]).info.status
    except Exception as err:
        return f"its MLflow run cannot be read ({type(err).__name__})"


def verify_checkpoints(directory: str, feds: list[Federation]) -> None:
    """Before a resume, for each unfinished federation of the experiment in ``directory``: the
    checkpoint that Tune's experiment state will restore it from exists, is whole and belongs
    to it (a one-line error naming the folder or file otherwise, before Ray starts or MLflow
    is written to).

    Tune deletes a trial's older checkpoint when it registers a newer one but saves its
    experiment state only every few checkpoints, so a kill in between leaves the state naming a
    deleted folder; restored, Tune deletes it again at the trial's next checkpoint and logs a
    ``FileNotFoundError`` traceback. Such folders are recreated empty, for Tune to delete."""
    import pyarrow.fs as pafs
    from ray.tune import ExperimentAnalysis

    fs, path = _filesystem(directory)
    if not any(i.base_name.startswith("experiment_state-")
               for i in fs.get_file_info(pafs.FileSelector(path))):
        raise RaydgError(f"{directory} holds no Tune experiment state (experiment_state-*.json):"
                         " the experiment stopped before its federations started; run it again")
    configs = {f.key: dataclasses.asdict(f.config) for f in feds}
    # raydg reads the trials' states only; ExperimentAnalysis also reads their metric files,
    # which a trial that never started (pending at the stop) has not: a warning for each
    with logs.without("ray.tune.analysis.experiment_analysis", "Failed to fetch metrics"):
        trials = ExperimentAnalysis(directory).trials
    for trial in trials:
        manager = trial.run_metadata.checkpoint_manager
        latest = manager.latest_checkpoint_result
        if trial.status == "TERMINATED" or latest is None:
            continue
        for older in manager.best_checkpoint_results:
            point = older.checkpoint
            if point.path != latest.checkpoint.path and not _exists(point):
                point.filesystem.create_dir(point.path)
        point = latest.checkpoint
        if not _exists(point):
            raise RaydgError(f"checkpoint {point.path}, which the experiment's state names as "
                             f"the last of {trial.config[FEDERATION]['key']}, is gone: that "
                             "federation cannot continue")
        with point.as_directory() as local:
            try:
                if checkpoint.is_checkpoint(Path(local)):
                    checkpoint.check(Path(local), configs[trial.config[FEDERATION]["key"]])
            except RaydgError as err:
                raise RaydgError(str(err).replace(local, point.path)) from None


def _exists(point: tune.Checkpoint) -> bool:
    import pyarrow.fs as pafs

    return point.filesystem.get_file_info(point.path).type != pafs.FileType.NotFound
