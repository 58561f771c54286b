"""Shared fixtures. Ray is started once per test module that needs it, and always shut down."""

from __future__ import annotations

import dataclasses

import pytest
import ray

from raydg.config import RunConfig, resolve


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


def tiny_config(**overrides) -> RunConfig:
    """A resolved digits-style config small enough for a test to run in seconds."""
    base = RunConfig(dataset="digits-style", method="fedavg", target="sketch", rounds=2,
                     local_steps=4, batch_size=16, val_every=2)
    return resolve(dataclasses.replace(base, **overrides))
