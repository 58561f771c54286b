"""Model state as plain numpy dicts: what travels through the object store and is aggregated."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn

State = dict[str, np.ndarray]

BN_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")


def to_numpy(model: nn.Module) -> State:
    """A detached copy of the model's full state dict (parameters and buffers)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def load(model: nn.Module, state: State, keys: Iterable[str] | None = None) -> None:
    """Copy ``state[k]`` into the model for each of ``keys`` (default: all of ``state``)."""
    own = model.state_dict()
    with torch.no_grad():
        for k in state if keys is None else keys:
            own[k].copy_(torch.tensor(state[k]))


def nbytes(state: State, keys: Iterable[str] | None = None) -> int:
    return int(sum(state[k].nbytes for k in (state if keys is None else keys)))


def is_bn_statistic(key: str) -> bool:
    return key.rsplit(".", 1)[-1] in BN_STATISTICS


def weighted_average(states: Sequence[State], weights: Sequence[float],
                     keys: Iterable[str] | None = None) -> State:
    """sum_k w_k * state_k / sum_k w_k, key by key, in the given (client-id) order.

    Accumulates in float64 and casts back to each tensor's dtype (integers are rounded), so the
    result is independent of where the states were computed.
    """
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("aggregation weights must sum to a positive number")
    out: State = {}
    for k in states[0] if keys is None else keys:
        acc = np.zeros(states[0][k].shape, dtype=np.float64)
        for s, w in zip(states, weights, strict=True):
            acc += (w / total) * s[k].astype(np.float64)
        dtype = states[0][k].dtype
        rounded = np.rint(acc) if np.issubdtype(dtype, np.integer) else acc
        out[k] = np.asarray(rounded, dtype=dtype)  # 0-d results stay arrays, not scalars
    return out


def digest(state: State, rows: Sequence[dict[str, float]] = ()) -> str:
    """A short SHA-256 of a state's names, dtypes, shapes and bytes and of metric ``rows``:
    equal digests mean bit-identical results (e.g. across two versions of the code)."""
    h = hashlib.sha256(json.dumps(list(rows), sort_keys=True).encode())
    for k in sorted(state):
        v = np.ascontiguousarray(state[k])
        h.update(f"{k}|{v.dtype.str}|{v.shape}|".encode())
        h.update(v.tobytes())
    return h.hexdigest()[:16]
