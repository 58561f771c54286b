"""raydg: a Ray-based parallel simulator for federated domain generalization.

Its Python API (:mod:`raydg.api`): ``raydg.run(...)``, ``raydg.resume(...)``,
``raydg.read_report(...)``, ``raydg.Results``, ``raydg.Interrupted``,
``raydg.simulation(...)`` (one federation, driven from Python) and ``raydg.load_model(...)``
(a logged model, :mod:`raydg.saved_model`), imported on first use
(``import raydg`` stays light, and a module that reads results never imports the engine)."""

from typing import Any

from raydg.version import __version__, installed_version

__all__ = ["Interrupted", "Results", "__version__", "installed_version", "load_model",
           "read_report", "resume", "run", "simulation"]


def __getattr__(name: str) -> Any:
    if name in ("run", "resume", "read_report", "Results", "simulation"):
        from raydg import api

        return getattr(api, name)
    if name == "load_model":
        from raydg.saved_model import load_model

        return load_model
    if name == "Interrupted":
        from raydg.trials.tuner import Interrupted

        return Interrupted
    raise AttributeError(f"module 'raydg' has no attribute {name!r}")
