"""raydg: a Ray-based parallel simulator for federated domain generalization.

Its Python API (:mod:`raydg.api`): ``raydg.run(...)``, ``raydg.read_report(...)``,
``raydg.Results`` and ``raydg.Interrupted``, imported on first use (``import raydg`` stays
light, and a module that reads results never imports the engine)."""

from typing import Any

__version__ = "0.1.0"
__all__ = ["Interrupted", "Results", "read_report", "run"]


def __getattr__(name: str) -> Any:
    if name in ("run", "read_report", "Results"):
        from raydg import api

        return getattr(api, name)
    if name == "Interrupted":
        from raydg.runner import Interrupted

        return Interrupted
    raise AttributeError(f"module 'raydg' has no attribute {name!r}")
