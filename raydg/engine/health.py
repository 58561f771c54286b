"""Signs that a federation's training failed, to be said as warnings rather than finishing
silently at chance or on meaningless weights."""

from __future__ import annotations

import math

import numpy as np

COLLAPSE_ROUNDS = 3


def collapse(history: list[dict[str, float]], classes: int) -> str | None:
    """Why training collapsed, if for ``COLLAPSE_ROUNDS`` rounds the training loss has stayed
    at ln(C) (uniform predictions over C classes, within 2 %) and source validation below twice
    chance."""
    chance = math.log(classes)
    recent = history[-COLLAPSE_ROUNDS:]
    if len(recent) == COLLAPSE_ROUNDS and all(
            abs(r["train_loss"] - chance) <= 0.02 * chance and r.get("val_acc", 0.0) < 2 / classes
            for r in recent):
        return (f"the training loss has stayed at ln({classes}) = {chance:.3f} for "
                f"{COLLAPSE_ROUNDS} rounds: the model predicts every class alike and learns "
                "nothing.")
    return None


def divergence(state: dict[str, np.ndarray], rnd: int, loss: float) -> str | None:
    """Why training diverged, if the aggregated model ``state`` holds a NaN or an infinity."""
    if all(np.isfinite(v).all() for v in state.values()):
        return None
    return (f"the global model holds NaN or infinite weights after round {rnd} (mean training "
            f"loss {loss:.3g}): training diverged and every later accuracy is meaningless.")
