"""A federation's logged model as an MLflow model "from code": MLflow stores this file's text
beside the weights (``artifacts/selected.npz``, ``final.npz``, ``model.json``), never a
pickle, and runs it to load the model, so that ``mlflow.pyfunc.load_model("runs:/RUN/model")``
predicts, ``mlflow models serve`` serves it and the model registry takes it. Loading needs
raydg installed (and any plugin that registered the run's method or model imported).

``predict`` takes uint8 images ``(n, C, H, W)`` as raydg's datasets hold them and returns the
class indices of the training-domain-validated round's model, as
:meth:`raydg.saved_model.SavedModel.predict` does.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np
from mlflow.pyfunc import PythonModel


class RaydgModel(PythonModel):
    """The logged global model of one federation (its selected round)."""

    def load_context(self, context) -> None:
        from raydg.saved_model import build

        info = json.loads(Path(context.artifacts["info"]).read_text())
        self.model = build(info, Path(context.artifacts["selected"]))

    def predict(self, context, model_input: np.ndarray, params=None) -> np.ndarray:
        """Class indices of uint8 images ``(n, C, H, W)``; the hint ``np.ndarray`` is one
        MLflow infers no schema from: the logged signature is the schema."""
        return self.model.predict(np.asarray(model_input, dtype=np.uint8))


mlflow.models.set_model(RaydgModel())
