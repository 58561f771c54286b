"""The divergence guard's rules on hand-made loss series (no Ray, no training)."""

from __future__ import annotations

import math

import numpy as np

from raydg.engine import health

CHANCE = math.log(10)


def test_a_loss_that_trains_or_wobbles_is_not_flagged():
    falling = [2.3, 2.1, 1.7, 1.2, 0.9]
    wobbling = [0.05, 0.01, 3.0, 0.2]  # a late round: up to 60x its first step, below ln(C)
    assert health.blowup(falling, {}, CHANCE) is None
    assert health.blowup(wobbling, {}, CHANCE) is None
    assert health.round_blowup(0.4, 2.3, CHANCE) is None


def test_the_first_step_past_a_hundred_times_its_reference_is_named_with_its_largest_term():
    # shaped like FedFD-A's first steps on a client of digits-gen (sum CAFL, lr 0.05)
    losses = [25.1, 107.0, 20.3, 3.55e4, 2.9e5]
    terms = {"fedfd/ce": [2.31, 2.33, 2.23, 45.1, 1.5e3],
             "fedfd/cafl": [5.7, 26.1, 4.5, 7.24e4, 4.49e6],
             "fedfd/cacl": [2.3, 2.48, 2.3, 20.6, 3.4e3]}
    said = health.blowup(losses, terms, CHANCE)
    assert said == ("training loss 3.55e+04 at step 4, from 25.1 at step 1; largest term "
                    "fedfd/cafl = 7.24e+04")
    assert 3.55e4 > health.GROWTH * 25.1 > 107.0  # step 4 is the first past the limit


def test_the_reference_is_at_least_the_chance_loss():
    # 0.01 at step 1: a rise to 2.0 (x200 of it) stays below 100 x ln(10) and is no alarm;
    # 300 is past it
    assert health.blowup([0.01, 2.0], {}, CHANCE) is None
    assert health.blowup([0.01, 2.0, 300.0], {}, CHANCE).startswith("training loss 300 at step 3")


def test_a_non_finite_loss_or_term_is_flagged_at_once_and_named_first():
    said = health.blowup([2.3, math.nan, 1.0], {"a": [1.0, 5.0, 1.0], "b": [1.0, math.inf, 1.0]},
                         CHANCE)
    assert said == "training loss nan at step 2, from 2.3 at step 1; largest term b = inf"
    assert health.round_blowup(math.inf, 2.3, CHANCE).startswith("mean training loss inf")


def test_terms_not_logged_at_every_step_are_judged_by_their_largest_value():
    said = health.blowup([2.0, 3e3], {"phase": [7.0, 9e9, 1.0]}, CHANCE)
    assert said.endswith("largest term phase = 9e+09")


def test_a_round_is_compared_with_round_one():
    assert health.round_blowup(2.4e3, 2.3, CHANCE) == ("mean training loss 2.4e+03, from 2.3 in "
                                                        "round 1")
    assert health.round_blowup(2.2e2, 2.3, CHANCE) is None  # below 100 x 2.3


def test_non_finite_weights_are_flagged():
    assert health.nonfinite_weights({"w": np.ones(3)}) is None
    assert health.nonfinite_weights({"w": np.array([1.0, np.nan])}) is not None


def test_a_loss_that_still_falls_near_chance_is_a_slow_start_not_a_collapse():
    """FedFD on digits-gen's high-frequency target, seed 2: three rounds within 2 % of ln(10)
    and validation below 20 %, but falling; it reached 32 % validation by round 10. A flat
    loss at ln(10) is still a collapse."""
    slow = [{"train_loss": v, "val_acc": a} for v, a in ((2.338, 0.09), (2.303, 0.083),
                                                           (2.265, 0.139))]
    assert health.collapse(slow, 10) is None
    flat = [{"train_loss": math.log(10) + d, "val_acc": 0.1} for d in (0.004, -0.003, 0.002)]
    assert health.collapse(flat, 10).startswith("the training loss has stayed at ln(10)")
    # FedFD at 32 px, seed 1: within 1 % of ln(10) over three rounds, but falling in each by
    # 0.021 in all (more than 0.25 % of ln(10), 0.0058): a slow start, as FedAvg's there
    steady = [{"train_loss": v, "val_acc": a} for v, a in ((2.292, 0.160), (2.288, 0.194),
                                                           (2.279, 0.181))]
    assert health.collapse(steady, 10) is None
    wiggle = [{"train_loss": v, "val_acc": 0.14} for v in (2.272, 2.259, 2.262)]  # MixStyle
    assert health.collapse(wiggle, 10) is None  # up once, down by 0.010 in all: still falling
    stuck = [{"train_loss": math.log(10) - d, "val_acc": 0.1} for d in (0.0001, 0.0004, 0.0009)]
    assert health.collapse(stuck, 10) is not None  # falling, by 8e-4: stuck at uniform
