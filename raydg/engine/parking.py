"""Client actors parked between federations, warm (torch imported, threads started), for the
next federation of the same shape to reset instead of starting new ones (2 s of CPU each).

Inside a Tune trial they wait in the trial's placement group for its next federation (Tune's
``reuse_actors``). Outside any trial (a notebook's, a benchmark's or a test's simulations) they
wait only while :func:`keep_warm` lasts, keeping their CPUs and GPUs: the experiment's process
releases them (:func:`release_free`) before its trials reserve the cluster. Imports no torch."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray

FREE = "free"  # the place of actors parked outside any trial
Kind = tuple[int, float, float]  # actors, CPUs and GPUs each

_PARKED: dict[str, tuple[Kind, list[Any]]] = {}
_warm = 0  # open keep_warm() scopes


def place() -> str | None:
    """Where a federation of this process parks its actors: its trial's placement group, else
    :data:`FREE` while :func:`keep_warm` lasts, else nowhere (None)."""
    group = ray.util.get_current_placement_group()
    return group.id.hex() if group else (FREE if _warm else None)


def park(kind: Kind, actors: list[Any]) -> None:
    """Leave ``actors`` (cleared of their clients) at :func:`place`."""
    _PARKED[place()] = (kind, actors)


def unpark(kind: Kind) -> list[Any]:
    """The actors parked at :func:`place` if they are of ``kind`` (the caller resets them);
    any that are not are killed, freeing their resources."""
    where = place()
    found, actors = _PARKED.pop(where, (None, [])) if where else (None, [])
    if found == kind:
        return actors
    for a in actors:
        ray.kill(a)
    return []


def release_free() -> None:
    """Kill the actors parked outside any trial."""
    for a in _PARKED.pop(FREE, (None, []))[1]:
        ray.kill(a)


@contextlib.contextmanager
def keep_warm() -> Iterator[None]:
    """While it lasts, a simulation outside any trial that finishes parks its client actors
    for the next one of the same shape on this Ray; at its end they are killed."""
    global _warm
    _warm += 1
    try:
        yield
    finally:
        _warm -= 1
        if not _warm:
            release_free()
