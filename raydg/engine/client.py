"""Client-side runtime: plain Python objects that Ray wraps as actors
(see :mod:`raydg.engine.actors`).

A :class:`ClientHost` holds one or more clients, their data shards and their persistent state
(local tensors and method memory) across rounds, plus one working model that it loads with a
client's weights whenever that client trains or evaluates; a client can be handed to another
host with its state (``release``, then ``adopt``). An :class:`Evaluator`, on the driver, holds
the held-out target domain, which no client ever sees.
"""

from __future__ import annotations

import functools
import math
import os
import platform
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray

from raydg.startup import heavy_imports

with heavy_imports():  # a client actor's first import: torch and the engine (raydg.startup)
    import torch
    import torch.nn.functional as F
    from torch import nn

    from raydg import seeding
    from raydg import state as st
    from raydg.checkpoint import register_dataclass
    from raydg.config import RunConfig
    from raydg.datasets import to_inputs
    from raydg.engine import health
    from raydg.errors import RaydgError
    from raydg.methods import ClientContext, Method, Upload
    from raydg.models import ModelSpec
    from raydg.partition import ClientData
    from raydg.transforms import augment_batch, make_transform


def where(device: torch.device | str = "cpu") -> dict[str, Any]:
    """The current process's Ray node id, host name, pid, torch device and machine."""
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "pid": os.getpid(), "device": str(device), "machine": machine(device)}


@functools.cache
def machine(device: torch.device | str = "cpu") -> str:
    """What runs here, for a row of results: CPU model and count, the GPU if ``device`` is
    one, e.g. ``Intel(R) Xeon(R) ... x2 CPUs`` or ``... x16 CPUs, NVIDIA H200``."""
    model = next((line.split(":", 1)[1].strip() for line in _cpuinfo()
                  if line.startswith("model name")), "") or platform.processor() or "CPU"
    gpu = f", {torch.cuda.get_device_name(device)}" if str(device).startswith("cuda") else ""
    return f"{model} x{os.cpu_count()} CPUs{gpu}"


def _cpuinfo() -> list[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:  # not Linux
        return []


def on_host(values: list[float | torch.Tensor]) -> list[float]:
    """Per-step values as floats: the tensors among them copied from their device at once (the
    same numbers as one read per step, without the host waiting at every step)."""
    tensors = [v.detach().reshape(()) for v in values if isinstance(v, torch.Tensor)]
    read = iter(torch.stack([t.to(tensors[0].device, torch.float64) for t in tensors]).cpu()
                .tolist() if tensors else [])
    return [next(read) if isinstance(v, torch.Tensor) else float(v) for v in values]


def pick_device(gpus: float, deterministic: bool) -> torch.device:
    """The actor's device. On a GPU with ``deterministic``, cuDNN's and torch's reproducible
    kernels (torch's defaults let cuDNN pick algorithms that add in any order: the same seed
    then gives other weights from run to run and with another number of actors); an operation
    that has no reproducible kernel warns (``warn_only``) rather than stopping the run."""
    if gpus <= 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RaydgError("gpus_per_actor > 0 but this worker sees no CUDA device")
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
    # both ways: a reused actor may have hosted a federation with the other setting
    torch.backends.cudnn.deterministic = deterministic
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    return torch.device("cuda")


@register_dataclass
@dataclass
class ClientState:
    """A client's persistent state; it travels with the client if it changes actor."""

    local: st.State | None = None  # the client's own copy of the method's local keys
    memory: dict[str, Any] = field(default_factory=dict)  # ``ClientContext.memory``


@dataclass
class ClientSlot:
    data: ClientData
    state: ClientState


@dataclass(frozen=True)
class RuntimeSpec:
    """What each runtime of a federation (its client hosts, its evaluator) is built from."""

    method: Method
    config: RunConfig
    model: ModelSpec
    mean: tuple[float, ...]  # the dataset's normalisation
    std: tuple[float, ...]


class Runtime:
    """What clients and the evaluator share: the method, a working model, and input handling."""

    def __init__(self, rt: RuntimeSpec) -> None:
        cfg = rt.config
        torch.set_num_threads(max(1, int(cfg.cpus_per_actor)))
        self.cfg = cfg
        self.device = pick_device(cfg.gpus_per_actor, cfg.deterministic)
        self.method = rt.method
        self.model = self.method.build_model(rt.model).to(self.device)
        self.chance_loss = math.log(rt.model.num_classes)  # a uniform prediction's
        self.local_keys = self.method.local_keys(self.model)
        # on the device once: a copy from host memory at every batch makes the host wait
        # for the GPU's queue
        self.mean, self.std = (torch.tensor(v, dtype=torch.float32, device=self.device)
                               for v in (rt.mean, rt.std))
        self.transform = make_transform(cfg.train_transform, rt.model.image_size)

    def where(self) -> dict[str, Any]:
        """Where this runtime runs: Ray node id, host name, process id and torch device."""
        return where(self.device)

    def inputs(self, x: np.ndarray) -> torch.Tensor:
        return to_inputs(x, self.mean, self.std, self.device)

    def train_inputs(self, x: np.ndarray) -> torch.Tensor:
        """``inputs`` of a training batch, after the configured per-image augmentation (run on
        the actor's device, on the uint8 images)."""
        if self.transform is None:
            return self.inputs(x)
        images = torch.from_numpy(np.array(x, dtype=np.uint8)).to(self.device)
        return to_inputs(augment_batch(images, self.transform), self.mean, self.std)

    def _predictions(self, model: nn.Module, x: np.ndarray, y: np.ndarray, mode: str
                     ) -> Iterator[tuple[torch.Tensor, np.ndarray]]:
        """``method.predict(model, ., mode)`` in eval mode and the labels, batch by batch."""
        was_training = model.training
        model.eval()
        try:
            for i in range(0, len(y), self.cfg.eval_batch_size):
                batch = slice(i, i + self.cfg.eval_batch_size)
                yield self.method.predict(model, self.inputs(x[batch]), mode), y[batch]
        finally:
            model.train(was_training)

    @torch.no_grad()
    def accuracy(self, model: nn.Module, x: np.ndarray, y: np.ndarray, mode: str) -> float:
        """Top-1 accuracy of ``method.predict(model, ., mode)`` in eval mode."""
        correct = sum(int((logits.argmax(1).cpu().numpy() == labels).sum())
                      for logits, labels in self._predictions(model, x, y, mode))
        return correct / max(1, len(y))

    @torch.no_grad()
    def loss_and_accuracy(self, model: nn.Module, x: np.ndarray, y: np.ndarray,
                          mode: str) -> tuple[float, float]:
        """Mean cross-entropy and top-1 accuracy of ``method.predict(model, ., mode)`` in eval
        mode."""
        loss = correct = 0.0
        for logits, labels in self._predictions(model, x, y, mode):
            target = torch.tensor(labels, device=logits.device)  # copied: read-only shards
            loss += float(F.cross_entropy(logits, target, reduction="sum"))
            correct += int((logits.argmax(1) == target).sum())
        return loss / max(1, len(y)), correct / max(1, len(y))


class ClientHost(Runtime):
    """Hosts clients: trains them, evaluates global models on their validation splits."""

    def __init__(self, rt: RuntimeSpec, shards: list[ClientData]) -> None:
        if rt.config.optimizer == "adam":
            # torch.optim imports torch._dynamo (about 1 s) on its first step: pay it when the
            # actor starts, not in round 1's training (raydg.optim.SGD imports nothing)
            import torch._dynamo  # noqa: F401

        super().__init__(rt)
        self.slots: dict[int, ClientSlot] = {}
        for shard in shards:
            self.adopt(shard)

    def reset(self, rt: RuntimeSpec) -> None:
        """Host another federation in this warm process: as if built anew."""
        self.__init__(rt, [])

    def clear(self) -> None:
        """Drop every hosted client (their shards and state), between federations."""
        self.slots.clear()

    def adopt(self, data: ClientData, state: ClientState | None = None) -> None:
        """Host a client: its shard (a zero-copy view when it comes from the object store)."""
        self.slots[data.client_id] = ClientSlot(data, state or ClientState())

    def release(self, cid: int) -> ClientState:
        """Stop hosting a client and hand back its persistent state."""
        return self.slots.pop(cid).state

    def snapshot(self) -> dict[int, ClientState]:
        """The persistent state of every hosted client (for a checkpoint)."""
        return {cid: slot.state for cid, slot in self.slots.items()}

    def set_state(self, cid: int, state: ClientState) -> None:
        """Continue a hosted client from a checkpointed state."""
        self.slots[cid].state = state

    def _context(self, cid: int, rnd: int, global_state: st.State) -> ClientContext:
        """Seed the client's streams for this round and load its view of the global model."""
        slot = self.slots[cid]
        torch.manual_seed(seeding.derive_seed(self.cfg.seed, seeding.CLIENT, cid, rnd, 0))
        st.load(self.model, global_state)
        if slot.state.local is not None:
            st.load(self.model, slot.state.local)
        self.model.train()
        return ClientContext(
            client_id=cid, round=rnd, data=slot.data, model=self.model, config=self.cfg,
            device=self.device, global_state=global_state, memory=slot.state.memory,
            generator=seeding.torch_generator(self.cfg.seed, seeding.CLIENT, cid, rnd, 1),
            inputs=self.inputs, train_inputs=self.train_inputs,
            evaluate=functools.partial(self.loss_and_accuracy, mode=self.method.eval_modes[0]),
        )

    def train(self, cid: int, global_state: st.State, rnd: int) -> Upload:
        """One round of local training with FedFD-A §4.1's client-side model selection.

        With ``client_selection`` the client validates every ``val_every`` steps (and after the
        last) and uploads its best-validation weights of the round; otherwise its last weights.
        """
        start = time.perf_counter()
        ctx = self._context(cid, rnd, global_state)
        self.method.start_round(ctx)
        data, cfg, mode = ctx.data, self.cfg, self.method.eval_modes[0]
        select = cfg.client_selection and len(data.val_y) > 0
        best_acc, best_state, losses = -1.0, None, []
        batches = ctx.batches()
        for step in range(1, cfg.local_steps + 1):
            x, y = next(batches)
            losses.append(self.method.train_step(ctx, x, y))
            if select and (step % cfg.val_every == 0 or step == cfg.local_steps):
                acc = self.accuracy(self.model, data.val_x, data.val_y, mode)
                if acc > best_acc:
                    best_acc, best_state = acc, st.to_numpy(self.model)
        self.method.end_round(ctx)
        upload = best_state if best_state is not None else st.to_numpy(self.model)
        self.slots[cid].state.local = {k: upload[k] for k in self.local_keys}
        losses, logged = on_host(losses), {k: on_host(v) for k, v in ctx.metrics.items()}
        metrics = {"train_loss": float(np.mean(losses)),
                   "seconds": time.perf_counter() - start, "steps": ctx.steps,
                   **{k: float(np.mean(v)) for k, v in logged.items()}}
        if select:
            metrics["local_val_acc"] = best_acc
        blowup = health.blowup(losses, {k: logged[k] for k in ctx.terms}, self.chance_loss)
        return Upload(cid, data.num_train, upload, metrics,
                      blowup and f"client {cid}'s {blowup}")

    def validate(self, global_state: st.State, with_local: bool,
                 clients: list[int] | None = None) -> tuple[dict[int, dict[str, float]], float]:
        """Each hosted client's (or of ``clients``, hosted here) validation accuracy under the
        global model, and the seconds it took.

        With ``with_local`` also under the global model carrying the client's own local tensors
        (in-federation accuracy with local statistics, FedIG-A appendix A.7, Table 12).
        """
        start = time.perf_counter()
        mode = self.method.eval_modes[0]
        out: dict[int, dict[str, float]] = {}
        st.load(self.model, global_state)
        for cid in sorted(self.slots if clients is None else clients):
            data, local = self.slots[cid].data, self.slots[cid].state.local
            out[cid] = {"val_acc": self.accuracy(self.model, data.val_x, data.val_y, mode)}
            if with_local and local is not None:
                st.load(self.model, local)
                out[cid]["val_acc_local"] = self.accuracy(self.model, data.val_x, data.val_y,
                                                          mode)
                st.load(self.model, global_state, local.keys())
        return out, time.perf_counter() - start

    def phase(self, name: str, cid: int, payload: Any, global_state: st.State,
              rnd: int) -> tuple[Any, int]:
        """Run the method's client phase ``name`` for client ``cid``: its result and the local
        steps it took."""
        ctx = self._context(cid, rnd, global_state)
        return self.method.client_phase(name, ctx, payload), ctx.steps


class Evaluator(Runtime):
    """Holds the target domain and evaluates global models on it in every inference mode."""

    def __init__(self, rt: RuntimeSpec, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__(rt)
        self.x, self.y = x, y

    def analyze(self, global_state: st.State) -> dict[str, list[dict]]:
        """The method's analysis of the global model on the target images."""
        st.load(self.model, global_state)
        self.model.eval()
        bs = self.cfg.eval_batch_size
        with torch.no_grad():
            return self.method.analyze(
                self.model, (self.inputs(self.x[i:i + bs]) for i in range(0, len(self.y), bs)))

    def evaluate(self, global_state: st.State) -> tuple[dict[str, float], float]:
        """Target accuracy in every inference mode, and the seconds it took."""
        start = time.perf_counter()
        st.load(self.model, global_state)
        return ({m: self.accuracy(self.model, self.x, self.y, m) for m in self.method.eval_modes},
                time.perf_counter() - start)
