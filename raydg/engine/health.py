"""Signs that a federation's training failed, to be said as warnings rather than finishing
silently at chance or on meaningless weights."""

from __future__ import annotations

import math

import numpy as np

COLLAPSE_ROUNDS = 3
STILL_FALLING = 0.0025  # of ln(C) over COLLAPSE_ROUNDS: a loss still falling near ln(C)
# a training loss this many times its reference has diverged: two orders of magnitude, where
# a loss that trains rises by a few times at most (a hard batch); the reference is the round's
# first step (for a step) or round 1 (for a round), and at least ln(C), the loss of a uniform
# prediction, so that a loss near zero late in training may rise to chance without an alarm
GROWTH = 100.0


def collapse(history: list[dict[str, float]], classes: int) -> str | None:
    """Why training collapsed, if for ``COLLAPSE_ROUNDS`` rounds the training loss has stayed
    at ln(C) (uniform predictions over C classes, within 2 %) without falling, and source
    validation is below twice chance. Not falling: its spread is within 1 % of ln(C) and it
    fell by less than ``STILL_FALLING`` of ln(C) from the first of those rounds to the last.
    A loss that still falls near ln(C) is a slow start, not a collapse (FedFD on digits-gen,
    16 px: 2.34, 2.30, 2.27, then 32 % validation; at 32 px: 2.291, 2.278, 2.270 at 17-19 %
    validation, as FedAvg's there; MixStyle there: 2.272, 2.259, 2.262, then 2.216); a model
    stuck at uniform outputs moves by about 1e-3."""
    chance = math.log(classes)
    recent = history[-COLLAPSE_ROUNDS:]
    losses = [r["train_loss"] for r in recent]
    if len(recent) < COLLAPSE_ROUNDS or max(losses) - min(losses) > 0.01 * chance or any(
            abs(r["train_loss"] - chance) > 0.02 * chance or r.get("val_acc", 0.0) >= 2 / classes
            for r in recent):
        return None
    if losses[0] - losses[-1] >= STILL_FALLING * chance:
        return None
    return (f"the training loss has stayed at ln({classes}) = {chance:.3f} for "
            f"{COLLAPSE_ROUNDS} rounds: the model predicts every class alike and learns "
            "nothing.")


def nonfinite_weights(state: dict[str, np.ndarray]) -> str | None:
    """Why training diverged, if the aggregated model ``state`` holds a NaN or an infinity."""
    if all(np.isfinite(v).all() for v in state.values()):
        return None
    return "the global model holds NaN or infinite weights"


def _reference(first: float, floor: float) -> float:
    return max(abs(first) if math.isfinite(first) else 0.0, floor)


def _term_at(step: int, losses: list[float], terms: dict[str, list[float]]) -> str:
    """`` (largest term NAME = V)``: of the loss terms logged at every step, the one largest
    at ``step`` (a non-finite one first); of terms logged otherwise, the largest anywhere."""
    values = {k: v[step - 1] if len(v) == len(losses) else max(v, key=_size)
              for k, v in terms.items() if v}
    if not values:
        return ""
    name = max(values, key=lambda k: _size(values[k]))
    return f"; largest term {name} = {values[name]:.3g}"


def _size(value: float) -> float:
    return math.inf if not math.isfinite(value) else abs(value)


def blowup(losses: list[float], terms: dict[str, list[float]], floor: float) -> str | None:
    """How a client's round of per-step training ``losses`` diverged, if a loss is not finite
    or exceeds ``GROWTH`` times the round's first (at least ``floor``): the first such step,
    its loss and the largest of the method's loss ``terms`` there (per-step values by name)."""
    reference = _reference(losses[0], floor)
    for step, loss in enumerate(losses, 1):
        if not math.isfinite(loss) or abs(loss) > GROWTH * reference:
            return (f"training loss {loss:.3g} at step {step}, from {losses[0]:.3g} at step 1"
                    + _term_at(step, losses, terms))
    return None


def round_blowup(loss: float, first: float, floor: float) -> str | None:
    """Why a round's mean training ``loss`` shows divergence, if it is not finite or exceeds
    ``GROWTH`` times round 1's (``first``, at least ``floor``)."""
    if math.isfinite(loss) and abs(loss) <= GROWTH * _reference(first, floor):
        return None
    return f"mean training loss {loss:.3g}, from {first:.3g} in round 1"
