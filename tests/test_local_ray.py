"""A fresh local Ray that raydg starts runs only the processes raydg uses (raydg.local_ray)."""

from __future__ import annotations

import psutil
import pytest
import ray
from ray._private import node

from raydg.config import RunConfig
from raydg.experiment import ray_session

# a command line's mark -> the process; what raydg's local Ray must run, and what it must not
NEEDED = {"gcs_server": "GCS", "raylet": "raylet", "dashboard/agent.py": "dashboard agent",
          "runtime_env/agent/main.py": "runtime-env agent"}
LEFT_OUT = {"dashboard/dashboard.py": "dashboard head", "autoscaler/_private/monitor.py":
            "autoscaler monitor", "_private/log_monitor.py": "log monitor"}


def _running() -> set[str]:
    """The marks of NEEDED and LEFT_OUT in the command lines of this process's descendants."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        found |= {mark for mark in (*NEEDED, *LEFT_OUT) if mark in line}
    return found


@ray.remote(num_cpus=1)
class Echo:
    def echo(self, value: int) -> int:
        return value


def test_a_fresh_local_ray_runs_what_raydg_uses_and_works():
    """Actors in a placement group run; Ray's node class is as it was afterwards."""
    if ray.is_initialized():
        pytest.fail("a test module left Ray running")
    patched = (node.Node.__init__, node.Node.start_api_server)
    with ray_session(RunConfig(dataset="digits-style")):
        assert _running() == set(NEEDED), _running()
        group = ray.util.placement_group([{"CPU": 1}, {"CPU": 1}])
        ray.get(group.ready())
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(group)
        actors = [Echo.options(scheduling_strategy=strategy).remote() for _ in range(2)]
        assert ray.get([a.echo.remote(i) for i, a in enumerate(actors)]) == [0, 1]
    assert not ray.is_initialized()
    assert (node.Node.__init__, node.Node.start_api_server) == patched
