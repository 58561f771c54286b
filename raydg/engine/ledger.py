"""Communication ledger: every message between clients and server, its bytes and its kind."""

from __future__ import annotations

import pickle
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

UP, DOWN = "up", "down"


def payload_nbytes(obj: Any) -> int:
    """Bytes of the arrays (and scalars) in a nested payload; other objects by pickle size."""
    if obj is None:
        return 0
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(payload_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(payload_nbytes(v) for v in obj)
    if isinstance(obj, bool | int | float | np.number):
        return 8
    return len(pickle.dumps(obj))


@dataclass
class Ledger:
    rows: list[dict[str, Any]] = field(default_factory=list)

    def add(self, rnd: int, client: int, direction: str, kind: str, nbytes: int) -> None:
        self.rows.append({"round": rnd, "client": client, "direction": direction,
                          "kind": kind, "bytes": int(nbytes)})

    def totals(self, rnd: int) -> dict[str, int]:
        """Bytes up and down in round ``rnd``: ``{"bytes_up": .., "bytes_down": ..}``."""
        out: dict[str, int] = defaultdict(int)
        for r in reversed(self.rows):  # rows are appended in round order
            if r["round"] != rnd:
                break
            out[f"bytes_{r['direction']}"] += r["bytes"]
        return {"bytes_up": out["bytes_up"], "bytes_down": out["bytes_down"]}
