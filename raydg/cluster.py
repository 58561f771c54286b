"""The Ray a run uses (:func:`ray_session`): the running session, a named cluster, or a fresh
local Ray with only the processes raydg uses (:func:`lean`).

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
import socket
from collections.abc import Callable, Iterator
from typing import Any

import ray

from raydg import plugins, reaper
from raydg.errors import RaydgError
from raydg.signals import stop_on_sigterm

CONNECT_TIMEOUT = 5.0  # seconds to reach a named Ray cluster before giving up


@contextlib.contextmanager
def lean(fresh: bool = True, dashboard: bool = False) -> Iterator[None]:
    """While it lasts, a head node that ``ray.init`` starts takes any free port for its
    dashboard agent, starts no idle workers for its first driver (Ray starts one per CPU;
    raydg's trials and actors never took them: measured, 0.8 s of CPU per start on 2 CPUs
    spent on workers that only exit) and, unless ``dashboard`` (``raydg run --dashboard``:
    Ray's own set and its dashboard), leaves out the dashboard head, the autoscaler monitor and
    the log monitor; nothing changes unless ``fresh`` (a cluster that raydg joins is as it
    was started)."""
    if not fresh or os.environ.get("RAYDG_LEAN_RAY") == "0":
        yield
        return
    from ray._private import node

    init, api_server = node.Node.__init__, node.Node.start_api_server

    def lean_init(self: Any, ray_params: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("head"):
            ray_params.dashboard_agent_listen_port = 0
            ray_params._system_config = {**(ray_params._system_config or {}),
                                         "prestart_worker_first_driver": False}
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


def check_reachable(address: str) -> None:
    """Refuse a ``host:port`` cluster address that does not answer (``ray.init`` would retry
    for minutes)."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        raise RaydgError(f"--address {address!r} is not 'auto', 'local' or HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as err:
        raise RaydgError(f"cannot reach the Ray cluster at {address}: {err}") from None


TOKEN_PLACES = ("the cluster's token (ray get-auth-token on its head) in RAY_AUTH_TOKEN, the "
                "file RAY_AUTH_TOKEN_PATH names or ~/.ray/auth_token")


def check_cluster(address: str | None) -> None:
    """Refuse a named ``host:port`` cluster that cannot be reached or joined, at once and in
    one line (``auto`` and a fresh local Ray, None, are left to ``ray.init``)."""
    if address and address != "auto":
        check_reachable(address)
        if not address.startswith("ray://"):  # a Ray Client server is no GCS
            check_authorized(address)


def check_authorized(address: str) -> None:
    """Refuse a ``host:port`` cluster that does not accept this process's token, or lack of
    one: ``ray.init`` would retry for 20 s and print each try. One request to the cluster's
    GCS, which answers at once; any other failure is left to ``ray.init``."""
    import grpc
    from ray._private.authentication.grpc_authentication_client_interceptor import (
        SyncAuthenticationMetadataClientInterceptor,
    )
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    from ray.exceptions import AuthenticationError

    target = address.split("://")[-1]
    channel = grpc.intercept_channel(grpc.insecure_channel(target),
                                     SyncAuthenticationMetadataClientInterceptor())
    try:
        gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
            gcs_service_pb2.GetClusterIdRequest(), timeout=CONNECT_TIMEOUT)
    except AuthenticationError:  # RAY_AUTH_MODE=token, and no token here
        raise RaydgError(f"cannot join the Ray cluster at {address}: RAY_AUTH_MODE=token but "
                         f"no token is set here; put {TOKEN_PLACES}") from None
    except grpc.RpcError as err:
        if err.code() == grpc.StatusCode.UNAUTHENTICATED and token_mode():
            raise RaydgError(f"cannot join the Ray cluster at {address}: it refused this "
                             f"process's token; put {TOKEN_PLACES}") from None
        if err.code() == grpc.StatusCode.UNAUTHENTICATED:
            raise RaydgError(f"cannot join the Ray cluster at {address}: it uses token "
                             f"authentication; set RAY_AUTH_MODE=token and put "
                             f"{TOKEN_PLACES}") from None
    finally:
        channel.close()


def token_mode() -> bool:
    """Whether this process sends Ray a token (``RAY_AUTH_MODE=token``)."""
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    return is_token_auth_enabled()


@contextlib.contextmanager
def _outside_job(fresh: bool) -> Iterator[None]:
    """For a fresh local Ray (``fresh``) inside a Ray job (``raydg doctor`` from
    jobs/smoke.sh): hide the job's runtime environment from ``ray.init``, which would give it to
    the new Ray, whose nodes cannot fetch the job's packages (its working_dir is a ``gcs://``
    URI of the cluster). The new Ray's workers import from the job's working directory, the
    driver's current directory, instead; its environment variables are this process's."""
    from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR as NAME

    hidden = os.environ.pop(NAME, None) if fresh else None
    try:
        yield
    finally:
        if hidden is not None:
            os.environ[NAME] = hidden


@contextlib.contextmanager
def ray_session(address: str | None, dashboard: bool = False,
                shipped: list[plugins.Plugin] | None = None, say: Callable[[str], None] = print
                ) -> Iterator[tuple[bool, list[Callable[[], None]]]]:
    """Use the running Ray session, join the cluster at ``address`` (``auto``: the one that
    ``ray start`` started last on this machine; :func:`raydg.plan.runtime` finds it), or,
    with none, start a local Ray (and finally stop what was started or joined). Yields whether
    no cluster was named, i.e. whether the Ray in use is this machine's own, and the list of
    what records a stop the moment SIGTERM arrives (:func:`raydg.signals.stop_on_sigterm`).
    The ``shipped`` plugins go to every worker; those from files need a Ray that raydg starts
    or joins. A local Ray runs only the processes raydg uses (:func:`lean`), or with
    ``dashboard`` all of Ray's and its dashboard, whose address goes to ``say``."""
    check_cluster(address)
    if ray.is_initialized():
        if any(p.file for p in shipped or ()):
            raise RaydgError("plugin files need a Ray that raydg starts or joins, to ship "
                             "them to its workers; this process started Ray itself: "
                             "ray.shutdown() first")
        yield address is None, []
        return
    try:  # "local": a fresh Ray, never a stale one that `ray start` left in /tmp/ray
        dashboard = address is None and dashboard
        with _outside_job(address is None), lean(address is None, dashboard):
            context = ray.init(address=address or "local", include_dashboard=dashboard,
                               logging_level="ERROR", log_to_driver=False,  # Ray's log files
                               runtime_env=plugins.runtime_env(shipped or []))
    except ConnectionError as err:
        raise RaydgError(f"cannot join a Ray cluster at {address}: {err}") from None
    if dashboard:
        token = " (token: ray get-auth-token)" if os.environ.get("RAY_AUTH_MODE") == "token" else ""
        say(f"raydg: Ray dashboard at http://{context.dashboard_url}{token}")
    # this machine's Ray ends with raydg, however raydg ends
    unwatch = reaper.watch() if address is None else None
    try:
        with stop_on_sigterm() as on_stop:
            yield address is None, on_stop
    finally:
        ray.shutdown()
        if unwatch is not None:
            unwatch()
