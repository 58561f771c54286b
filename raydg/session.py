"""What an experiment runs in: Ray (:func:`raydg.cluster.ray_session`) and its MLflow parent
run (:class:`~raydg.tracking.tracker.Tracker`), both where the plan's runtime says."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from raydg import plugins
from raydg.cluster import ray_session
from raydg.plan import Plan
from raydg.tracking.store import check_store
from raydg.tracking.tracker import Tracker


@contextlib.contextmanager
def session(plan: Plan, run_id: str | None, say: Callable[[str], None]
            ) -> Iterator[tuple[bool, Tracker, list[Callable[[], None]]]]:
    """Ray and the experiment's MLflow parent run (run ``run_id`` again, resuming), which a
    SIGTERM ends ``KILLED`` as it arrives; yields whether Ray is this machine's own, the
    tracker and what records a stop. A tracking server that does not answer is refused
    before Ray starts; a new SQLite store's schema, which takes seconds to create, is made
    while Ray starts."""
    where = plan.runtime
    sqlite = where.tracking_uri.startswith("sqlite:///")
    if not sqlite:
        check_store(where.tracking_uri)
    say(f"raydg: joining the Ray cluster at {where.address}" if where.address
        else "raydg: starting Ray")
    with ThreadPoolExecutor(1) as pool:
        store = pool.submit(check_store, where.tracking_uri, where.cache) if sqlite else None
        with ray_session(where.address, where.dashboard, plan.plugins, say) as (local, on_stop):
            if store is not None:
                store.result()
            with Tracker(where.tracking_uri, plan.config, plan.label, plan.search, run_id,
                         plan.name) as tracker:
                on_stop.append(lambda: tracker.end("KILLED"))
                for key, value in plugins.tags(plan.plugins).items():
                    tracker.set_tag(key, value)
                yield local, tracker, on_stop
