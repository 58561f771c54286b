"""Issue 29's workload in Flower 1.41's simulation: what ``benchmarks/memory.py --flower``
measures beside raydg.

The same federation as ``raydg run digits-style --target sketch --clients 30 --dirichlet 0.1
--sample 10 --local-steps 20 --rounds 10 --seed 0 --actors 2``: raydg's own data, partition
(:func:`raydg.partition.make_clients`) and ``cnn`` model; FedAvg weighted by samples, 10 of 30
clients per round, each 20 SGD steps of 32 images (lr 0.05, momentum 0.5, the digits'
defaults); every round, as raydg does, every client validates the new global model on its
validation split and the server evaluates it on the held-out domain. Two ClientApp actors of
one CPU each (Flower's ``client_resources``). Prints ``round R/10 ...`` as each round ends.

It runs in its own environment (Flower 1.41 pins Ray 2.55.1; raydg's own is 2.60):
    python -m venv flwr-venv && flwr-venv/bin/pip install 'flwr[simulation]==1.41.0' \\
        torch==2.14.1 torchvision==0.29.1 scikit-learn scipy pillow pyyaml psutil \\
        && flwr-venv/bin/pip install --no-deps -e .
Run:  flwr-venv/bin/python benchmarks/flower_workload.py
"""

from __future__ import annotations

import functools
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation

from raydg.datasets import load_dataset, to_inputs
from raydg.models import ModelSpec, build_model
from raydg.partition import Partition, make_clients

CLIENTS, SAMPLE, ROUNDS, STEPS, BATCH, LR, MOMENTUM, SEED = 30, 10, 10, 20, 32, 0.05, 0.5, 0
DATASET, TARGET, ALPHA, VAL_FRACTION, SIZE = "digits-style", "sketch", 0.1, 0.1, 16
START = time.perf_counter()


@functools.cache
def data() -> tuple:
    """The dataset and the 30 clients' shards (once per process)."""
    ds = load_dataset(DATASET, None, SIZE, log=lambda _: None)
    return ds, make_clients(ds, Partition(TARGET, CLIENTS, ALPHA, VAL_FRACTION, SEED))


def model() -> torch.nn.Module:
    ds, _ = data()
    return build_model(ModelSpec("cnn", ds.channels, len(ds.classes), SIZE))


def accuracy(net: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    ds, _ = data()
    net.eval()
    with torch.no_grad():
        pred = torch.cat([net(to_inputs(x[i:i + 256], ds.mean, ds.std)).argmax(1)
                          for i in range(0, len(y), 256)])
    return float((pred.numpy() == y).mean())


app = ClientApp()


def client(context: Context):
    torch.set_num_threads(1)
    _, clients = data()
    return clients[int(context.node_config["partition-id"])]


@app.train()
def train(msg: Message, context: Context) -> Message:
    shard, (ds, _) = client(context), data()
    net = model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    net.train()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    rng = np.random.default_rng([SEED, shard.client_id, int(msg.content["config"]["server-round"])])
    for _ in range(STEPS):
        idx = rng.choice(shard.num_train, size=min(BATCH, shard.num_train), replace=False)
        loss = F.cross_entropy(net(to_inputs(shard.train_x[idx], ds.mean, ds.std)),
                               torch.from_numpy(shard.train_y[idx]).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()),
                          "metrics": MetricRecord({"train_loss": loss.item(),
                                                   "num-examples": shard.num_train})})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    shard = client(context)
    net = model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    acc = accuracy(net, shard.val_x, shard.val_y)
    metrics = MetricRecord({"val_acc": acc, "num-examples": len(shard.val_y)})
    return Message(content=RecordDict({"metrics": metrics}), reply_to=msg)


server = ServerApp()


@server.main()
def main(grid: Grid, context: Context) -> None:
    ds, _ = data()
    torch.manual_seed(SEED)
    target = ds.domain(TARGET)

    def target_accuracy(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        net = model()
        net.load_state_dict(arrays.to_torch_state_dict())
        acc = accuracy(net, target.x, target.y)
        if rnd:
            print(f"round {rnd}/{ROUNDS} target {100 * acc:.2f} after "
                  f"{time.perf_counter() - START:.1f} s", flush=True)
        return MetricRecord({"target_acc": acc})

    strategy = FedAvg(fraction_train=SAMPLE / CLIENTS, fraction_evaluate=1.0)
    result = strategy.start(grid, ArrayRecord(model().state_dict()), num_rounds=ROUNDS,
                            evaluate_fn=target_accuracy)
    print("Avg", result.evaluate_metrics_serverapp[ROUNDS]["target_acc"], flush=True)


if __name__ == "__main__":  # the apps from this module imported by name, as Ray's workers do
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, here)
    from flower_workload import app as client_app
    from flower_workload import server as server_app

    run_simulation(server_app, client_app, num_supernodes=CLIENTS,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})
