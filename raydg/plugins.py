"""Methods, datasets and models from outside raydg: plugins.

A plugin is a Python module whose import registers entries with raydg's registries (the
``@register`` of :mod:`raydg.methods`, ``DATASETS.register``, ``MODELS.register``), from
either

* an installed package that names it under an entry-point group ``raydg.methods``,
  ``raydg.datasets`` or ``raydg.models`` in its ``pyproject.toml`` (every such plugin is loaded
  whenever raydg plans an experiment or lists its registries), or
* ``--plugin MODULE_OR_FILE`` (a config key ``plugins``): a module name, or a ``.py`` file.

A plugin that fails to import, or registers a name that raydg or another plugin has, is refused
with one line naming it, before Ray starts. An experiment ships its plugins to every Ray worker
(Ray's runtime environment: ``py_modules``, imported by a worker set-up hook), so they run on a
cluster whose nodes do not have them installed; each plugin's origin (package and version, or
file and hash) is logged to MLflow.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points, packages_distributions, version
from pathlib import Path
from types import ModuleType
from typing import Any

from raydg.errors import RaydgError
from raydg.registry import registering_as

GROUPS = ("raydg.methods", "raydg.datasets", "raydg.models")
SHIPPED = "RAYDG_PLUGINS"  # the modules a Ray worker imports at start, comma-separated


@dataclass(frozen=True)
class Plugin:
    """A loaded plugin: its module's name, where it comes from (``origin``, as ``raydg list``
    and MLflow show it), what a Ray worker needs to import it (``ship``: a file or a package
    folder) and whether it is a ``.py`` file (``file``; else importable here by name)."""

    module: str
    origin: str
    ship: str
    file: bool = False


def load(given: list[str] | tuple[str, ...] = ()) -> list[Plugin]:
    """Import the entry-point plugins of the installed packages, then ``given`` (module names
    or ``.py`` files) in order; each once per process. Without any, nothing is imported (not
    even raydg's registries, which import torch)."""
    found = _entry_points()
    if found or given:
        _built_ins()
    return list(dict.fromkeys([*map(_from_entry_point, found), *(_given(s) for s in given)]))


def _built_ins() -> None:
    """Import raydg's registries first, so that its own entries count as built-in."""
    import raydg.datasets
    import raydg.methods
    import raydg.models  # noqa: F401


def _entry_points() -> list[Any]:
    return [ep for group in GROUPS for ep in sorted(entry_points(group=group),
                                                    key=lambda e: e.name)]


def _entry_point_origin(ep: Any) -> str:
    label = f"{ep.dist.name} {ep.dist.version}" if ep.dist else ep.value
    return f"plugin {label} (entry point {ep.group}:{ep.name})"


def _from_entry_point(ep: Any) -> Plugin:
    return _import(ep.module, _entry_point_origin(ep))


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec


def _module_origin(spec: str) -> str:
    dist = packages_distributions().get(spec.split(".")[0])
    return f"plugin {spec}" + (f" ({dist[0]} {version(dist[0])})" if dist else "")


def _file_origin(path: Path) -> str:
    return f"plugin {path} (sha256 {hashlib.sha256(path.read_bytes()).hexdigest()[:12]})"


def _given(spec: str) -> Plugin:
    return _file(Path(spec)) if _is_file(spec) else _import(spec, _module_origin(spec))


def _file(path: Path) -> Plugin:
    """A ``.py`` file, imported as the module named by its stem (what Ray's workers import
    it as, from ``py_modules``)."""
    if not path.is_file():
        raise RaydgError(f"plugin {str(path)!r}: no such file")
    path = path.resolve()
    name = path.stem
    loaded = sys.modules.get(name)
    if loaded is not None and Path(getattr(loaded, "__file__", "") or "").resolve() != path:
        raise RaydgError(f"plugin {str(path)!r}: a module named {name!r} is already imported "
                         f"(from {getattr(loaded, '__file__', None) or 'built-in'}); rename "
                         "the file")
    origin = _file_origin(path)
    if loaded is None:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        _run(lambda: spec.loader.exec_module(module), name, origin, str(path))
    return Plugin(name, origin, str(path), file=True)


def _import(name: str, origin: str) -> Plugin:
    module = sys.modules.get(name)
    if module is None:
        module = _run(lambda: importlib.import_module(name), name, origin, name)
    return Plugin(name, origin, _package_folder(module))


def _run(load_module: Any, name: str, origin: str, shown: str) -> ModuleType:
    """Import as ``origin``; any failure is one line, and leaves neither the module nor its
    entries behind."""
    try:
        with registering_as(origin):
            return load_module() or sys.modules[name]
    except RaydgError as err:
        sys.modules.pop(name, None)
        raise RaydgError(f"plugin {shown!r}: {err}") from None
    except SystemExit as err:  # would end raydg silently, with the plugin's exit code
        sys.modules.pop(name, None)
        raise RaydgError(f"plugin {shown!r} calls sys.exit({err.code!r}) while it is "
                         "imported: a plugin only registers entries") from None
    except ModuleNotFoundError as err:
        sys.modules.pop(name, None)
        what = "no module named" if err.name == name else "it imports a missing module"
        raise RaydgError(f"plugin {shown!r}: {what} {err.name!r}") from None
    except Exception as err:  # any error of the plugin's own code
        sys.modules.pop(name, None)
        where = _where(err, shown)
        raise RaydgError(f"plugin {shown!r} fails to import: {type(err).__name__}: "
                         f"{err}{where}") from None


def _where(err: Exception, shown: str) -> str:
    """`` (file.py, line N)``: the plugin's line that raised, unless the message says it."""
    if isinstance(err, SyntaxError):
        return ""
    frames = [f for f in _frames(err.__traceback__) if f[0].endswith(".py")]
    own = [f for f in frames if "importlib" not in f[0]]
    return f" ({Path(own[-1][0]).name}, line {own[-1][1]})" if own else ""


def _frames(tb: Any) -> list[tuple[str, int]]:
    out = []
    while tb is not None:
        out.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
        tb = tb.tb_next
    return out


def _package_folder(module: ModuleType) -> str:
    """What a worker needs to import ``module``: its top-level package's folder, or its file."""
    top = sys.modules[module.__name__.split(".")[0]]
    paths = list(getattr(top, "__path__", []))
    return paths[0] if paths else top.__file__


def runtime_env(plugins: list[Plugin]) -> dict[str, Any] | None:
    """Ray's runtime environment that gives every worker the plugins: their files or package
    folders (``py_modules``) and a set-up hook that imports them (:func:`load_shipped`)."""
    if not plugins:
        return None
    return {"py_modules": sorted({p.ship for p in plugins}),
            "env_vars": {SHIPPED: ",".join(p.module for p in plugins)},
            "worker_process_setup_hook": "raydg.plugins.load_shipped"}


def load_shipped() -> None:
    """A Ray worker's set-up hook: import the plugins the experiment shipped (``SHIPPED``)."""
    _built_ins()
    for name in filter(None, os.environ.get(SHIPPED, "").split(",")):
        if name not in sys.modules:
            with registering_as(f"plugin {name}"):
                importlib.import_module(name)


def check_unchanged(given: list[str], recorded: list[str]) -> None:
    """Refuse, before importing anything, to continue an experiment whose plugins are not
    those it started with (``recorded``: their origins then, with each file's hash or
    package's version; ``given``: the experiment's ``plugins``)."""
    now = [*map(_entry_point_origin, _entry_points()),
           *(_file_origin(Path(s).resolve()) if _is_file(s) and Path(s).is_file()
             else _module_origin(s) for s in given)]
    changed = sorted(set(recorded) - set(now))
    if changed:
        raise RaydgError(f"the experiment started with {changed[0]}, which is not here now "
                         f"(now: {', '.join(now) or 'none'}): its federations would mix two "
                         "versions of the plugin's code; put it back as it was, or start a new "
                         "experiment")


def tags(plugins: list[Plugin]) -> dict[str, str]:
    """MLflow tags that say which plugins ran: ``raydg.plugin.<module>``: its origin."""
    return {f"raydg.plugin.{p.module}": p.origin.removeprefix("plugin ") for p in plugins}
