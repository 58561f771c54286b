"""A federation's logged global model, loaded for inference in two lines::

    import raydg
    model = raydg.load_model("CHILD_RUN_ID", tracking_uri="sqlite:///mlflow.db")

``model.predict(images)`` takes uint8 images ``(n, C, H, W)`` as raydg's datasets hold them
(``raydg.datasets.load_dataset(...).domain(name).x``) and returns class indices;
``model.module`` is the torch model in eval mode. A child run logs an MLflow model,
``model/`` (:mod:`raydg.mlflow_model`: ``mlflow.pyfunc.load_model`` loads it too), whose
artifacts are its weights (``final.npz``, ``selected.npz``: the training-domain-validated
round's) and what rebuilding needs, ``model.json``: the architecture and its input (model name,
channels, classes and their names, image size, the dataset's normalisation) and the method
with its options and reported inference mode (e.g. FedSR's mean embedding). A plugin's method
or model must be registered (imported) before loading.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raydg.tracking.logged_model import INFO


def model_info(cfg: Any, channels: int, classes: list[str], mean: tuple[float, ...],
               std: tuple[float, ...], mode: str) -> dict[str, Any]:
    """What :func:`load_model` needs beside the weights, as plain JSON values."""
    return {"model": cfg.model, "in_channels": channels, "num_classes": len(classes),
            "classes": list(classes), "image_size": cfg.image_size,
            "mean": [float(v) for v in mean], "std": [float(v) for v in std],
            "method": cfg.method, "augment": cfg.augment, "aggregation": cfg.aggregation,
            "options": dict(cfg.options), "mode": mode}


@dataclass
class SavedModel:
    """A logged global model: ``module`` (eval mode), its method (for the inference mode)
    and ``info`` (``model.json``)."""

    module: Any
    method: Any
    info: dict[str, Any]

    @property
    def classes(self) -> list[str]:
        return self.info["classes"]

    def logits(self, images: np.ndarray) -> Any:
        """The method's logits in its reported mode for uint8 images ``(n, C, H, W)``."""
        import torch

        from raydg.datasets import to_inputs

        with torch.no_grad():
            x = to_inputs(images, tuple(self.info["mean"]), tuple(self.info["std"]))
            return self.method.predict(self.module, x, self.info["mode"])

    def predict(self, images: np.ndarray) -> np.ndarray:
        """Class indices (into :attr:`classes`) of uint8 images ``(n, C, H, W)``."""
        return self.logits(images).argmax(1).numpy()


def load_model(run_id: str, tracking_uri: str | None = None,
               which: str = "selected") -> SavedModel:
    """The global model that child run ``run_id`` logged: ``selected`` (the round
    training-domain validation selected) or ``final`` (the last round)."""
    from mlflow.artifacts import download_artifacts

    from raydg.config import RunConfig
    from raydg.errors import RaydgError
    from raydg.tracking.store import tracking_uri as store_uri

    if which not in ("selected", "final"):
        raise RaydgError(f"which={which!r}: 'selected' or 'final'")
    uri = store_uri(RunConfig(tracking_uri=tracking_uri))
    try:
        folder = Path(download_artifacts(run_id=run_id, artifact_path="model",
                                         tracking_uri=uri))
    except Exception as err:  # MlflowException, OSError: the run or its artifacts are missing
        raise RaydgError(f"run {run_id} in {uri} has no logged model: {err} (a child run, "
                         "one per federation, logs its model)") from None
    files = folder / "artifacts"  # an MLflow model's (raydg.mlflow_model)
    if not (files / INFO).exists():
        raise RaydgError(f"run {run_id} in {uri} has no logged model/artifacts/{INFO}: a "
                         "raydg before 0.1.0 logged it")
    return build(json.loads((files / INFO).read_text()), files / f"{which}.npz")


def build(info: dict[str, Any], weights: Path) -> SavedModel:
    """The model ``info`` describes, with the weights of the ``.npz`` file ``weights``."""
    from raydg import state
    from raydg.methods import build as build_method
    from raydg.models import ModelSpec
    from raydg.results import load_state

    method = build_method(info["method"], info["augment"], info["aggregation"], info["options"])
    module = method.build_model(ModelSpec(info["model"], info["in_channels"],
                                          info["num_classes"], info["image_size"]))
    state.load(module, load_state(weights))
    return SavedModel(module.eval(), method, info)
