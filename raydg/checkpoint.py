"""Federation checkpoints in safe formats, written so that a partial one is never used.

A checkpoint is a folder:

* ``state.json``: the format, the hash of the federation's resolved config, and the
  federation's state as a JSON tree in which every array is a reference into ``arrays.npz``;
* ``arrays.npz``: every numpy array (the global model, each client's local tensors and method
  memory), read back with ``allow_pickle=False``;
* ``manifest.json``, written last: the SHA-256 of the two files. A folder without a manifest, or
  whose files do not match it, is refused (a checkpoint cut short, corrupted, or edited).

Only plain values travel: None, bools, numbers, strings, lists, tuples, sets, dicts (any hashable
plain keys), numpy arrays and scalars, torch tensors (stored as numpy), and the dataclasses of
:data:`DATACLASSES`. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from raydg.config import NOT_RESULTS
from raydg.errors import RaydgError

FORMAT = "raydg-federation-checkpoint/1"
FILES = ("state.json", "arrays.npz")
DATACLASSES: dict[str, type] = {}  # name -> class, filled by register_dataclass


def register_dataclass(cls: type) -> type:
    """Allow ``cls`` (a dataclass of plain fields) in checkpoints."""
    DATACLASSES[cls.__name__] = cls
    return cls


def config_hash(config: dict[str, Any]) -> str:
    """What a checkpoint must match to be resumed: the result-relevant config keys."""
    kept = {k: v for k, v in config.items() if k not in NOT_RESULTS}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()


def _pack(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.ndarray):
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"array": name}
    if isinstance(value, np.generic):
        return {"scalar": value.dtype.str, "value": value.item()}
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        return {"tensor": _pack(value.detach().cpu().numpy(), arrays)}
    if isinstance(value, dict):
        return {"dict": [[_pack(k, arrays), _pack(v, arrays)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_pack(v, arrays) for v in value]
    if isinstance(value, tuple | set):
        kind = "tuple" if isinstance(value, tuple) else "set"
        return {kind: [_pack(v, arrays) for v in value]}
    name = type(value).__name__
    if dataclasses.is_dataclass(value) and DATACLASSES.get(name) is type(value):
        return {"dataclass": name, "fields": {f.name: _pack(getattr(value, f.name), arrays)
                                              for f in dataclasses.fields(value)}}
    raise RaydgError(f"cannot checkpoint a {type(value).__module__}.{name}: a method's state "
                     "must hold arrays, numbers, strings, lists, dicts or registered dataclasses")


def _unpack(tree: Any, arrays: Any) -> Any:
    if isinstance(tree, list):
        return [_unpack(v, arrays) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "array" in tree:
        return arrays[tree["array"]]
    if "scalar" in tree:
        return np.dtype(tree["scalar"]).type(tree["value"])
    if "tensor" in tree:
        import torch

        return torch.from_numpy(_unpack(tree["tensor"], arrays))
    if "dict" in tree:
        return {_unpack(k, arrays): _unpack(v, arrays) for k, v in tree["dict"]}
    if "tuple" in tree:
        return tuple(_unpack(v, arrays) for v in tree["tuple"])
    if "set" in tree:
        return {_unpack(v, arrays) for v in tree["set"]}
    cls = _dataclass(tree["dataclass"])
    return cls(**{k: _unpack(v, arrays) for k, v in tree["fields"].items()})


def _dataclass(name: str) -> type:
    """A registered dataclass: its module registers it on import (the engine's own, e.g.
    ``ClientState``, when the reader has imported the engine, a method's with the methods)."""
    if name not in DATACLASSES:
        raise RaydgError(f"a checkpoint holds a {name}, which no imported module registers")
    return DATACLASSES[name]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write(folder: Path, state: dict[str, Any], config: dict[str, Any]) -> None:
    """Write ``state`` (a federation's, see
    :meth:`raydg.engine.simulation.Simulation.snapshot`) into the empty folder ``folder``; the
    manifest last."""
    arrays: dict[str, np.ndarray] = {}
    tree = {"format": FORMAT, "config": config_hash(config), "state": _pack(state, arrays)}
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    blobs = {"state.json": json.dumps(tree).encode(), "arrays.npz": buffer.getvalue()}
    folder.mkdir(parents=True, exist_ok=True)
    for name, blob in blobs.items():
        (folder / name).write_bytes(blob)
    manifest = {"format": FORMAT, "files": {n: _sha256(b) for n, b in blobs.items()}}
    (folder / "manifest.json").write_text(json.dumps(manifest))


def is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a federation checkpoint (not a finished result)."""
    return (folder / "manifest.json").exists() or (folder / "state.json").exists()


def read(folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The state in ``folder``, after :func:`check`; its dataclasses are those registered in
    this process (:func:`register_dataclass`)."""
    tree, arrays = _whole(folder, config)
    try:
        return _unpack(tree["state"], arrays)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise RaydgError(f"checkpoint {folder} matches its manifest but cannot be read "
                         f"({type(err).__name__}: {err})") from None


def check(folder: Path, config: dict[str, Any]) -> None:
    """That the checkpoint in ``folder`` is whole, of this format, and of a federation with
    the same result-relevant ``config``; a one-line error naming the file otherwise. Reads
    no state (no engine or torch needed: an experiment's process checks before a resume)."""
    _whole(folder, config)


def _whole(folder: Path, config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint's tree and arrays, once :func:`check`'s conditions hold."""
    manifest_path = folder / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        expected = manifest["files"]
        if manifest.get("format") != FORMAT:
            raise RaydgError(f"checkpoint {manifest_path} is not a raydg federation "
                             f"checkpoint ({manifest.get('format')!r})")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise RaydgError(f"checkpoint {manifest_path} is missing or unreadable ({err}): "
                         "an incomplete checkpoint is never used") from None
    if not isinstance(expected, dict) or sorted(expected) != sorted(FILES):
        names = sorted(expected) if isinstance(expected, dict) else expected
        raise RaydgError(f"checkpoint {manifest_path} names {names}, not the files of a "
                         f"checkpoint {list(FILES)}: refused before any is opened")
    blobs = {}
    for name in FILES:
        path = folder / name
        try:
            blobs[name] = path.read_bytes()
        except OSError as err:
            raise RaydgError(f"checkpoint file {path} is missing: {err}") from None
        if _sha256(blobs[name]) != expected.get(name):
            raise RaydgError(f"checkpoint file {path} does not match its manifest: it is "
                             "truncated or corrupt")
    try:
        tree = json.loads(blobs["state.json"])
        same = tree.get("config") == config_hash(config)
        with np.load(io.BytesIO(blobs["arrays.npz"]), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, KeyError, TypeError, AttributeError, OSError,
            zipfile.BadZipFile) as err:  # e.g. an object array, which needs pickle
        raise RaydgError(f"checkpoint {folder} matches its manifest but cannot be read "
                         f"({type(err).__name__}: {err})") from None
    if not same:
        raise RaydgError(f"checkpoint {folder / 'state.json'} belongs to a federation with a "
                         "different config; it cannot continue this one")
    return tree, arrays
