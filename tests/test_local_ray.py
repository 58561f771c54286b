"""A fresh local Ray that raydg starts runs only the processes raydg uses (raydg.cluster.lean)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import psutil
import pytest
import ray
from ray._private import node

from raydg.cluster import ray_session

# each process by the marks of its command line (an agent renames itself once it has started)
NEEDED = {"GCS": ("gcs_server",), "raylet": ("raylet",),
          "dashboard agent": ("dashboard/agent.py", "ray::DashboardAgent"),
          "runtime-env agent": ("runtime_env/agent/main.py", "ray::RuntimeEnvAgent")}
LEFT_OUT = {"dashboard head": ("dashboard/dashboard.py",),
            "autoscaler monitor": ("autoscaler/_private/monitor.py",),
            "log monitor": ("_private/log_monitor.py",)}


def _running() -> set[str]:
    """The processes of NEEDED and LEFT_OUT among this process's descendants."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        found |= {name for name, marks in {**NEEDED, **LEFT_OUT}.items()
                  if any(mark in line for mark in marks)}
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
    with ray_session(None, say=pytest.fail):
        assert _running() == set(NEEDED), _running()
        # no idle workers for the first driver (raydg's trials never took them)
        config = ray._private.worker._global_node._ray_params._system_config
        assert config["prestart_worker_first_driver"] is False
        group = ray.util.placement_group([{"CPU": 1}, {"CPU": 1}])
        ray.get(group.ready())
        strategy = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy(group)
        actors = [Echo.options(scheduling_strategy=strategy).remote() for _ in range(2)]
        assert ray.get([a.echo.remote(i) for i, a in enumerate(actors)]) == [0, 1]
    assert not ray.is_initialized()
    assert (node.Node.__init__, node.Node.start_api_server) == patched


def test_dashboard_flag_starts_rays_own_set_and_its_dashboard():
    """``--dashboard``: Ray's monitors and the dashboard head run, and the printed address
    answers."""
    said: list[str] = []
    with ray_session(None, dashboard=True, say=said.append):
        assert _running() == set(NEEDED) | set(LEFT_OUT), _running()
        [line] = said
        assert line.startswith("raydg: Ray dashboard at http://")
        url = line.split()[4]
        request = urllib.request.Request(f"{url}/api/version")
        if line.endswith("(token: ray get-auth-token)"):  # Ray's default for a local Ray
            token = (Path.home() / ".ray" / "auth_token").read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(request, timeout=30) as response:
            assert "ray_version" in response.read().decode()
    assert not ray.is_initialized()
