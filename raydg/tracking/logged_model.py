"""A federation's global model as its child run logs it: the states (``<name>.npz``, no
pickle) and ``model.json`` (:data:`INFO`, what rebuilds the model), as the artifacts of an
MLflow model from code, ``model/`` (:mod:`raydg.mlflow_model`). :mod:`raydg.saved_model`
reads them back."""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

INFO = "model.json"
# run by MLflow, never imported here
MODEL_CODE = Path(__file__).resolve().parents[1] / "mlflow_model.py"


def log_model(client: Any, run_id: str, models: dict[str, Any], info: dict[str, Any],
              version: str) -> None:
    """Log model states (``<name>.npz``, no pickle) and what rebuilds the model
    (``model.json``) into run ``run_id`` as the artifacts of an MLflow model from code,
    ``model/`` (:mod:`raydg.mlflow_model`, requiring raydg ``version``):
    ``mlflow.pyfunc.load_model("runs:/RUN/model")`` and :func:`raydg.load_model` both load it."""
    import mlflow
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    # MLflow copies the model's files with a progress bar wherever tqdm is installed: one
    # "Downloading artifacts" bar per file on a run's console (a user's own setting is kept)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    with tempfile.TemporaryDirectory() as tmp:
        files = {name: Path(tmp) / f"{name}.npz" for name, state in models.items()
                 if state is not None}
        for name, path in files.items():
            np.savez(path, **models[name])
        (Path(tmp) / INFO).write_text(json.dumps(info, indent=1))
        images = (-1, info["in_channels"], info["image_size"], info["image_size"])
        signature = ModelSignature(Schema([TensorSpec(np.dtype("uint8"), images)]),
                                   Schema([TensorSpec(np.dtype("int64"), (-1,))]))
        with warnings.catch_warnings():  # MLflow's advice on input examples
            warnings.filterwarnings("ignore", message=".*input example")
            mlflow.pyfunc.save_model(
                Path(tmp) / "model", python_model=str(MODEL_CODE), signature=signature,
                artifacts={"info": str(Path(tmp) / INFO),
                           **{name: str(path) for name, path in files.items()}},
                pip_requirements=[f"raydg=={version}"])
        client.log_artifacts(run_id, str(Path(tmp) / "model"), artifact_path="model")
