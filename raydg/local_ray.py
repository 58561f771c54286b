"""A fresh local Ray with only the processes raydg uses.

``ray.init`` of a local Ray starts, besides the GCS and the raylet (and the raylet's dashboard
and runtime-env agents, which it cannot run without), three processes that a local raydg run
never uses; measured on a 2-core VM (Ray 2.60, USS, settled after ``ray.init``):

* the dashboard head (70 MB), started even with ``include_dashboard=False``, where it serves no
  page and runs no job API; ``ray.init`` waits for it (about 2 s);
* the autoscaler monitor (46 MB), which reports a local cluster's resources to ``ray status``
  and slows ``ray.shutdown`` by a second;
* the log monitor (43 MB), which forwards workers' output to drivers with ``log_to_driver``
  (raydg sets it off: workers' output stays in Ray's log files).

Ray has no ``ray.init`` argument for these: :func:`lean` sets the head node's parameters that
``ray start`` exposes (``--no-monitor``, ``--include-log-monitor``, and a dashboard agent port
of 0, which never waits for a port that another Ray on the machine holds) and skips the
dashboard head. It patches ``ray._private.node.Node`` (checked for Ray 2.60, which
constraints.txt pins; tests/test_local_ray.py lists the processes). A dashboard, job
submission and ``ray status`` stay one flag away (``raydg run --dashboard``), or one
``ray start --head`` away: raydg joins that Ray with ``--address auto``. ``RAYDG_LEAN_RAY=0``
starts Ray's own set (should a Ray upgrade break the patch; ``benchmarks/memory.py`` compares
the two).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def lean(fresh: bool = True, dashboard: bool = False) -> Iterator[None]:
    """While it lasts, a head node that ``ray.init`` starts takes any free port for its
    dashboard agent and, unless ``dashboard`` (``raydg run --dashboard``: Ray's own set and
    its dashboard), leaves out the dashboard head, the autoscaler monitor and the log monitor;
    nothing changes unless ``fresh`` (a cluster that raydg joins is as it was started)."""
    if not fresh or os.environ.get("RAYDG_LEAN_RAY") == "0":
        yield
        return
    from ray._private import node

    init, api_server = node.Node.__init__, node.Node.start_api_server

    def lean_init(self: Any, ray_params: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("head"):
            ray_params.dashboard_agent_listen_port = 0
            if not dashboard:
                ray_params.no_monitor = True
                ray_params.include_log_monitor = False
        init(self, ray_params, *args, **kwargs)

    node.Node.__init__ = lean_init
    if not dashboard:
        node.Node.start_api_server = lambda self, **_: None
    try:
        yield
    finally:
        node.Node.__init__, node.Node.start_api_server = init, api_server
