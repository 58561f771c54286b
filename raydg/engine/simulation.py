"""The driver of one federated run (one held-out target domain, one seed).

It samples clients, puts the global weights into the object store once per round, gathers
uploads as they finish, aggregates in client-id order, evaluates, and selects the round by
mean source-validation accuracy over all training ("seen") clients (FedFD-A §4.1; FedIG-A
appendix A.2). It knows no method by name: a method
plugs in through :class:`raydg.methods.Method` and sees this object as its ``Server``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch
from torch import Tensor

from raydg import seeding
from raydg import state as st
from raydg.config import clients_per_round
from raydg.datasets import MultiDomainDataset
from raydg.engine import health
from raydg.engine.actors import ClientPool, describe_placement
from raydg.engine.client import Evaluator, RuntimeSpec, where
from raydg.engine.ledger import DOWN, UP, Ledger, payload_nbytes
from raydg.errors import RaydgError
from raydg.methods import Method, Upload
from raydg.models import ModelSpec
from raydg.partition import make_clients
from raydg.results import FederationResult, round_summaries
from raydg.saved_model import model_info

if TYPE_CHECKING:
    from raydg.plan import Federation

CLIENT_ONLY = ("seconds", "local_val_acc", "steps")  # per-client metrics, not round means
# a round's evaluation under way: target future, validation refs, validators, their weights
Evaluation = tuple[Future, list[Any], list[int], list[float] | None]


class Simulation:
    """Runs one (target, seed) federation; the ``Server`` that method hooks receive."""

    def __init__(self, fed: Federation, data: MultiDomainDataset, method: Method,
                 log: Callable[[str], None] = print, weights: dict[str, Tensor] | None = None,
                 restore: dict[str, Any] | None = None) -> None:
        """``fed``: the federation as planned (:func:`raydg.planning.federation` plans one),
        ``method`` the method that runs it (:func:`raydg.methods.build` builds a registered
        one). ``weights`` is the backbone's initial state as the experiment loaded it (needed
        when ``fed`` starts from pretrained weights: the engine loads none). ``restore`` is a
        :meth:`snapshot` to continue from."""
        self.config = cfg = fed.config
        self.label = fed.row
        self.log = log
        self.method = method
        clients = method.arrange_clients(make_clients(data, fed.partition), cfg)
        self.client_ids = [c.client_id for c in clients]
        self.num_samples = {c.client_id: c.num_train for c in clients}
        self.domains = {c.client_id: c.domain for c in clients}
        self.spec = ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size)
        self.model_info = model_info(cfg, data.channels, data.classes, data.mean, data.std,
                                     self.method.eval_modes[0])
        self._init_global(fed.init, weights)
        self._init_rounds()
        test = data.domain(cfg.target)
        # the target domain stays on the driver (which checks its device before any actor
        # starts); evaluation runs in a thread beside the rounds
        rt = RuntimeSpec(method, self.config, self.spec, data.mean, data.std)
        self.evaluator = Evaluator(dataclasses.replace(rt, method=copy.deepcopy(method)),
                                   test.x, test.y)
        self._evaluation = ThreadPoolExecutor(1, thread_name_prefix="target-evaluation")
        self.pool = ClientPool(rt, clients)
        if restore is not None:
            try:
                self._restore(restore)
            except BaseException:
                self.pool.shutdown()
                raise

    def _init_global(self, init: str | None, weights: dict[str, Tensor] | None) -> None:
        """The initial global model: the backbone's ``weights`` if it starts from pretrained
        ones (``init``), else a seeded initialisation."""
        cfg = self.config
        torch.manual_seed(seeding.derive_seed(cfg.seed, seeding.MODEL_INIT))
        if weights is None and init is not None:
            raise RaydgError(f"{cfg.model} starts from {init} weights: pass them "
                             "(raydg.pretrain.initial_weights loads them)")
        # only the initial global model is built with pretrained weights; actors build the
        # architecture and receive the global state
        model = self.method.build_model(dataclasses.replace(self.spec, weights=weights))
        self.local_keys = self.method.local_keys(model)
        self.global_state = st.to_numpy(model)

    def _init_rounds(self) -> None:
        """The state of the rounds before the first: ledger, tables, sampler, selection."""
        self.round = 0
        self.ledger = Ledger()
        self.tables: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._has_local: set[int] = set()
        self._steps = 0  # local steps of client phases since the last round's row
        self.history: list[dict[str, float]] = []  # rounds whose evaluation has finished
        self._sampler = seeding.numpy_rng(self.config.seed, seeding.SAMPLING)
        # the last aggregated round, its evaluation under way: (row, futures, start, state)
        self._pending: tuple[dict[str, float], Any, float | None, st.State] | None = None
        self._selected: st.State | None = None  # the global model of the best round so far
        self._restored_row: dict[str, float] | None = None
        self._restored_validators: list[int] = []

    # ------------------------------------------------------------------ checkpoints
    @property
    def resumable(self) -> bool:
        """Whether a :meth:`snapshot` can be taken now (between two rounds)."""
        return self._pending is not None

    def snapshot(self) -> dict[str, Any]:
        """Everything the federation needs to continue after the last aggregation: the global
        model, the rows of the evaluated rounds and the training row of the last round (its
        evaluation is redone on restore), ledger, tables, the sampler's state, every client's
        persistent state (local tensors, method memory) and the method's server state. Client
        randomness needs no state: it is derived from (seed, client, round)."""
        assert self._pending is not None, "a snapshot is taken between rounds"
        return {"round": self.round, "global_state": self.global_state,
                "history": self.history, "pending": self._pending[0],
                "selected_state": self._selected,
                "ledger": self.ledger.rows, "tables": dict(self.tables),
                "has_local": sorted(self._has_local), "steps": self._steps,
                "validators": self._pending[1][2],
                "sampler": self._sampler.bit_generator.state,
                "clients": self.pool.snapshot(), "server": self.method.server_state()}

    def _restore(self, snap: dict[str, Any]) -> None:
        self.round, self.global_state = snap["round"], snap["global_state"]
        self.history, self._restored_row = snap["history"], snap["pending"]
        self._restored_validators = snap["validators"]
        self._selected = snap["selected_state"]
        self.ledger.rows = snap["ledger"]
        self.tables.update(snap["tables"])
        self._has_local, self._steps = set(snap["has_local"]), snap["steps"]
        self._sampler.bit_generator.state = snap["sampler"]
        self.pool.restore(snap["clients"])
        self.method.load_server_state(snap["server"])

    # ------------------------------------------------------------------ Server protocol
    def call_clients(self, phase: str, payload: Any = None, *, kind: str,
                     result_kind: str | None = None,
                     clients: list[int] | None = None) -> dict[int, Any]:
        cids = sorted(clients if clients is not None else self.client_ids)
        for c in cids:
            self._ledger_message(c, DOWN, kind, payload)
        done = self.pool.phase(phase, cids, ray.put(payload), ray.put(self.global_state),
                               self.round)
        results = {c: r for c, (r, _) in done.items()}
        self._steps += sum(steps for _, steps in done.values())
        for c, r in results.items():
            self._ledger_message(c, UP, result_kind or kind, r)
        return results

    def _ledger_message(self, cid: int, direction: str, kind: str, payload: Any) -> None:
        """One message; a ``state`` is entered per kind of information its tensors carry."""
        if kind != "state":
            self.ledger.add(self.round, cid, direction, kind, payload_nbytes(payload))
            return
        by_kind: dict[str, int] = defaultdict(int)
        for k, v in payload.items():
            by_kind[self.method.upload_kind(k)] += v.nbytes
        for info, n in sorted(by_kind.items()):
            self.ledger.add(self.round, cid, direction, info, n)

    def record(self, table: str, row: dict[str, Any]) -> None:
        self.tables[table].append({"round": self.round, **row})

    # ------------------------------------------------------------------ rounds
    def _ledger_round(self, cids: list[int], uploads: list[Upload]) -> None:
        """Download: the keys a client loads (local keys only on first participation).
        Upload: every uploaded tensor, by the kind of information it carries."""
        for c in cids:
            keys = [k for k in self.global_state
                    if c not in self._has_local or k not in self.local_keys]
            self.ledger.add(self.round, c, DOWN, "parameters", st.nbytes(self.global_state, keys))
        for u in uploads:
            self._ledger_message(u.client_id, UP, "state", u.state)
        self._has_local.update(cids)

    def _validators(self, rnd: int, sampled: list[int]) -> list[int]:
        """The clients whose source validation scores round ``rnd``'s model
        (``validate_clients``: all, the round's sampled ones, or K drawn from the round's own
        stream), every ``validate_every`` rounds and in the last; none in other rounds."""
        cfg = self.config
        if rnd % cfg.validate_every and rnd != cfg.rounds:
            return []
        if cfg.validate_clients == "all":
            return self.client_ids
        if cfg.validate_clients == "sampled":
            return sampled
        k = min(int(cfg.validate_clients), len(self.client_ids))
        drawn = seeding.numpy_rng(cfg.seed, seeding.VALIDATION, rnd).choice(
            self.client_ids, size=k, replace=False)
        return sorted(int(c) for c in drawn)

    def _start_evaluation(self, global_ref: Any, validators: list[int]) -> Evaluation:
        """Start target evaluation (a driver thread) and the validators' source validation of
        the current global model; return the futures, the validators and their weights in
        ``val_acc`` (the method's, or None: the mean)."""
        return (self._evaluation.submit(self.evaluator.evaluate, self.global_state),
                self.pool.validate(global_ref, self.config.eval_local, validators), validators,
                self.method.validation_weights(validators) if validators else None)

    def _finish_evaluation(self, futures: Evaluation) -> dict[str, float]:
        """Source-validation accuracy over the validators, their mean or the method's weighted
        mean (none: no ``val_acc``, the round cannot be selected), and target accuracy per
        mode."""
        target, validation, validators, weights = futures
        metrics: dict[str, float] = {}
        accuracies, metrics["time/evaluate"] = target.result()
        for mode, acc in accuracies.items():
            metrics[f"target_acc/{mode}"] = acc
        metrics["target_acc"] = metrics[f"target_acc/{self.method.eval_modes[0]}"]
        if not validators:
            return metrics
        parts, seconds = zip(*ray.get(validation), strict=True)
        seen = sorted(c for part in parts for c in part)
        if seen != validators:
            raise RuntimeError(f"validation covered clients {seen}, expected each of "
                               f"{validators} once")
        merged = {c: v for part in parts for c, v in part.items()}
        per_client = [merged[c] for c in validators]  # client-id order: layout-independent
        metrics["val_acc"] = float(np.average([v["val_acc"] for v in per_client],
                                              weights=weights))
        if self.config.eval_local:
            metrics["val_acc_local"] = float(np.mean(
                [v["val_acc_local"] for v in per_client if "val_acc_local" in v]))
        metrics["time/validate"] = max(seconds)
        return metrics

    def _record_placement(self) -> None:
        """Where the driver (which also evaluates) and each client actor run: table
        ``placement``."""
        rows = [{"role": "driver", **where(self.evaluator.device)}, *self.pool.placement()]
        self.tables["placement"] = rows
        self.log(describe_placement(rows, self.config))

    def run(self, on_round: Callable[[dict[str, float]], None] | None = None
            ) -> FederationResult:
        """All rounds (after a restore, the rest). Round r's evaluation runs while round r+1
        trains (each actor runs its tasks in submission order, so round r validates every
        client where it was hosted then); ``round_seconds`` is the time from one round's start
        to the next's (none for a restored round). ``on_round(row)`` is called as each round's
        evaluation finishes, when the next round is aggregated: the moment a :meth:`snapshot`
        may be taken."""
        finished = False
        try:
            self._record_placement()
            if self._restored_row is None:
                self.method.setup(self)
            global_ref = ray.put(self.global_state)  # then once per round, after aggregation
            if self._restored_row is not None:  # the restored round's evaluation, again
                self._pending = (self._restored_row,
                                 self._start_evaluation(global_ref, self._restored_validators),
                                 None, self.global_state)
            for rnd in range(self.round + 1, self.config.rounds + 1):
                start, previous = time.perf_counter(), self._pending
                global_ref = self._round(rnd, global_ref, start)
                if previous is not None:
                    self._finish(*previous, on_round, end=start)
            last, self._pending = self._pending, None
            if last is not None:
                self._finish(*last, on_round)
            analysis = self.evaluator.analyze(self.global_state)
            self.tables.update({f"target_{name}": rows for name, rows in analysis.items()})
            result = self._result(self.history, self.method.summarize(analysis))
            finished = True
            return result
        finally:
            self._evaluation.shutdown()
            self.pool.shutdown(park=finished)  # warm actors for the trial's next run

    def _round(self, rnd: int, global_ref: Any, start: float) -> Any:
        """Round ``rnd``: sample, train and aggregate, then start its evaluation (the new
        ``_pending``); the new global model's object ref."""
        self.round = rnd
        n = len(self.client_ids)
        cids = sorted(int(c) for c in self._sampler.choice(
            n, size=clients_per_round(self.config, n), replace=False))
        uploads = self.pool.train(cids, global_ref, rnd)
        trained = time.perf_counter()
        self._ledger_round(cids, uploads)
        for u in uploads:
            self.record("client_rounds", {"client": u.client_id, **u.metrics})
        self.global_state = self.method.aggregate(self, uploads)
        global_ref = ray.put(self.global_state)
        row = self._training_metrics(rnd, uploads)
        row.update(self._phase_times(uploads, start, trained))
        self._warn("divergence", rnd, self._divergence(rnd, uploads, row))
        row.update(self.ledger.totals(rnd), clients_moved=self.pool.moved)
        row.update(self.method.on_round_end(self))
        self._pending = (row, self._start_evaluation(global_ref, self._validators(rnd, cids)),
                         start, self.global_state)
        return global_ref

    def _divergence(self, rnd: int, uploads: list[Upload], row: dict[str, float]) -> str | None:
        """The first sign that round ``rnd`` diverged: a client's loss exploding within the
        round (the lowest client id's), the round's mean loss against round 1's, or weights
        that are not finite (:mod:`raydg.engine.health`)."""
        rows = [*self.history, *([self._pending[0]] if self._pending else []), row]
        chance = math.log(self.spec.num_classes)
        sign = (next((u.blowup for u in sorted(uploads, key=lambda u: u.client_id)
                      if u.blowup), None)
                or health.round_blowup(row["train_loss"], rows[0]["train_loss"], chance)
                or health.nonfinite_weights(self.global_state))
        return sign and (f"{self.label} diverged in round {rnd}: {sign}. Every later accuracy "
                         "of this federation is meaningless.")

    def _finish(self, row: dict[str, float], futures: Any, start: float | None,
                state: st.State, on_round: Callable[[dict[str, float]], None] | None,
                end: float | None = None) -> None:
        """Complete a round's row with its evaluation, select it if its source validation is
        the best so far (the first such round), and hand it to ``on_round``. A restored round
        (``start`` None: it started in the process that was stopped) has no ``round_seconds``."""
        waiting = time.perf_counter()
        row.update(self._finish_evaluation(futures))
        row["time/wait"] = time.perf_counter() - waiting
        if start is not None:
            row["round_seconds"] = (end or time.perf_counter()) - start
        if "val_acc" in row and row["val_acc"] > max(
                (r["val_acc"] for r in self.history if "val_acc" in r), default=-1.0):
            self._selected = state
        self.history.append(row)
        self._warn("collapse", int(row["round"]),
                   health.collapse(self.history, self.spec.num_classes))
        if on_round is not None:
            on_round(row)

    def _phase_times(self, uploads: list[Upload], start: float, trained: float
                      ) -> dict[str, float]:
        """Where a round's time goes, beside ``round_seconds``: ``time/train`` from the round's
        start to the last upload; ``time/busy`` the clients' own training seconds per actor
        (``train - busy``: actors idle behind stragglers, dispatch, the previous round's
        validation); ``time/aggregate`` aggregating and putting the new global model. Set
        with the evaluation: ``time/validate`` (the slowest actor's source validation, queued
        before the next round's training), ``time/evaluate`` (target, a driver thread) and
        ``time/wait`` (the driver blocked on both after the next aggregation)."""
        busy = sum(u.metrics["seconds"] for u in uploads) / len(self.pool.actors)
        return {"time/train": trained - start, "time/busy": busy,
                "time/aggregate": time.perf_counter() - trained}

    def _training_metrics(self, rnd: int, uploads: list[Upload]) -> dict[str, float]:
        """The round's mean training loss, every value the method logged (mean over the
        clients that logged it) and the local steps of all clients (client phases since the
        last round included, e.g. CSAC's acquisition in round 1)."""
        row: dict[str, float] = {"round": rnd}
        logged = [k for k in dict.fromkeys(k for u in uploads for k in u.metrics)
                  if k not in CLIENT_ONLY]
        for k in logged:
            row[k] = float(np.mean([u.metrics[k] for u in uploads if k in u.metrics]))
        row["steps"] = self._steps + sum(int(u.metrics["steps"]) for u in uploads)
        self._steps = 0
        return row

    def _warn(self, kind: str, rnd: int, message: str | None) -> None:
        """Print a warning of ``kind`` (if there is one) once per federation, naming the likely
        cause; its round and text go to table ``kind``."""
        if message is None or kind in self.tables:
            return
        message = "warning: " + message + " " + (
            self.method.collapse_hint or "Likely a learning rate too high or a loss term that "
            "outweighs the cross-entropy.")
        self.tables[kind].append({"round": rnd, "message": message})
        self.log(message)

    def _result(self, history: list[dict[str, float]],
                final: dict[str, float]) -> FederationResult:
        tables = dict(self.tables)
        tables["ledger"] = self.ledger.rows
        tables["clients"] = [{"client": c, "domain": self.domains[c],
                              "train_samples": self.num_samples[c]} for c in self.client_ids]
        return FederationResult(
            method=self.label, target=self.config.target, seed=self.config.seed,
            history=history, selected_state=self._selected,
            **round_summaries(history, self.method.eval_modes),
            global_state=self.global_state, tables=tables,
            plots=dict(self.method.plots), final=final, model=self.model_info,
        )
