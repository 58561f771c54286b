"""Several MLflow stores read as one, for ``raydg report --tracking-uri A --tracking-uri B``
(a SQLite URI may be a glob, ``sqlite:////scratch/mlflow-stores/*.db``): a Slurm job writes a
store of its own, so that no two hosts write one SQLite file at once, and a report reads them
all. :class:`Stores` answers the calls that the report makes to ``MlflowClient``; an
experiment is known by its name (its id differs from store to store)."""

from __future__ import annotations

import glob
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from raydg.errors import EmptyResult


def expand(uris: Sequence[str]) -> list[str]:
    """The stores ``uris`` name: each SQLite glob replaced by the files it matches, in order;
    a glob that matches nothing is an :class:`EmptyResult`."""
    out: list[str] = []
    for uri in uris:
        path = uri.removeprefix("sqlite:///")
        if not uri.startswith("sqlite:///") or not glob.has_magic(path):
            out.append(uri)
            continue
        found = sorted(glob.glob(path))
        if not found:
            raise EmptyResult(f"no MLflow store matches {uri}")
        out += [f"sqlite:///{p}" for p in found]
    return list(dict.fromkeys(out))


class Stores:
    """MLflow clients of several stores behind one client's calls (those ``raydg report``
    makes, artifacts aside)."""

    def __init__(self, clients: Sequence[Any]) -> None:
        self.clients = list(clients)
        self.tracking_uri = ", ".join(c.tracking_uri for c in self.clients)
        self.home: dict[str, Any] = {}  # run id -> the client of its store

    def search_experiments(self, **_: Any) -> list[SimpleNamespace]:
        names = dict.fromkeys(e.name for c in self.clients for e in c.search_experiments())
        return [SimpleNamespace(experiment_id=n, name=n) for n in names]

    def get_experiment_by_name(self, name: str) -> SimpleNamespace | None:
        found = any(c.get_experiment_by_name(name) for c in self.clients)
        return SimpleNamespace(experiment_id=name, name=name) if found else None

    def search_runs(self, experiment_ids: Sequence[str], filter_string: str = "",
                    **kwargs: Any) -> list[Any]:
        """The runs of the named experiments in every store, oldest first."""
        runs = []
        for client in self.clients:
            named = {e.experiment_id: e.name for e in map(client.get_experiment_by_name,
                                                          experiment_ids) if e is not None}
            for run in client.search_runs(list(named), filter_string, **kwargs) if named else []:
                self.home[run.info.run_id] = client
                runs.append(_named(run, named[run.info.experiment_id]))
        return sorted(runs, key=lambda r: r.info.start_time)

    def get_metric_history(self, run_id: str, key: str) -> list[Any]:
        return self.home[run_id].get_metric_history(run_id, key)


def open_stores(uris: Sequence[str], open_one: Callable[[str], Any]) -> Any:
    """One client for one store; a :class:`Stores` for several (``open_one`` opens each)."""
    clients = [open_one(uri) for uri in expand(uris)]
    return clients[0] if len(clients) == 1 else Stores(clients)


def _named(run: Any, experiment: str) -> SimpleNamespace:
    """``run`` with its experiment known by name, as the other stores know it."""
    i = run.info
    info = SimpleNamespace(run_id=i.run_id, status=i.status, experiment_id=experiment,
                           start_time=i.start_time, end_time=i.end_time)
    return SimpleNamespace(info=info, data=run.data)
