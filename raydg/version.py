"""raydg's version: the one it declares, and what is installed."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0.dev0"  # as in pyproject.toml


def installed_version() -> str:
    """raydg's installed version; from a source tree on ``PYTHONPATH`` (a Ray job's
    ``working_dir``, a machine where it is not installed) its ``__version__`` and where it is.
    ``importlib.metadata`` is imported here, not by ``import raydg``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("raydg")
    except PackageNotFoundError:
        return f"{__version__} (not installed: source in {Path(__file__).parent})"
