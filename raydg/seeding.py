"""Deterministic random streams derived from (seed, *keys), e.g. (seed, client id, round).

Every stochastic choice of a run draws from a stream named by what it is for, so results do not
depend on how clients are spread over Ray actors or in which order they finish.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


# The seeds every library of a run takes: numpy's SeedSequence no negative one, pyarrow's int64
# columns (the results tables logged to MLflow) none above 2**63 - 1 (torch.manual_seed takes
# any derived seed: they have 63 bits)
MAX_SEED = 2**63 - 1


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed that depends only on ``seed`` and the integer ``keys``."""
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def numpy_rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def torch_generator(seed: int, *keys: int) -> torch.Generator:
    import torch  # here: planning partitions with this module in a process without torch

    return torch.Generator().manual_seed(derive_seed(seed, *keys))


# Stream names (first key) so that different purposes never share a stream.
PARTITION, SPLIT, SAMPLING, MODEL_INIT, CLIENT, VALIDATION = 1, 2, 3, 4, 5, 6
