"""Bad input costs one line (exit code 2), never memory or minutes: YAML aliases, huge
populations, symlink loops and special files among the images, tags in ``--set``, huge seeds,
and a token-protected cluster joined without its token (issue 60)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from raydg import seeding
from raydg.cli.app import cli
from raydg.config import RunConfig, parse_sets
from raydg.config_files import MAX_YAML_BYTES, MAX_YAML_VALUES, load_yaml
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.resolve import resolve
from tests.conftest import free_ports, stop_ray_start, wait_for_head

SCREEN_LINE = 200  # characters: what an error line may take


def one_error_line(result) -> str:
    """The only line a refused command printed (stdout and stderr), after checking exit code 2."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raydg: error: "), lines
    return lines[0]


@contextlib.contextmanager
def bounded(seconds: float, mib: float) -> Iterator[None]:
    """Fail if the block takes more than ``seconds`` (interrupting a blocked call) or
    allocates more than ``mib`` MiB at its peak (Python allocations, numpy's included)."""
    def expired(*_args):
        raise TimeoutError(f"took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    tracemalloc.start()
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert peak < mib * 2**20, f"allocated {peak / 2**20:.0f} MiB"


def laughs(levels: int, key: str) -> str:
    """The "billion laughs" shape under ``key``: 9 strings, then ``levels - 1`` lists of 9
    aliases of the list before (9**levels strings once expanded)."""
    lines = [f"{key}:", "- &a [" + ",".join(["lol"] * 9) + "]"]
    lines += [f"- &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]"
              for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("key", ["rounds", "seeds"])
def test_yaml_aliases_are_refused_before_they_expand(tmp_path, key):
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs(9, key))  # 9**9 = 387 M strings from 323 bytes
    assert path.stat().st_size < 400
    with bounded(seconds=5, mib=20), pytest.raises(RaydgError) as err:
        load_yaml(path)
    assert f"{MAX_YAML_VALUES:,} values" in str(err.value) and "aliases" in str(err.value)
    line = one_error_line(CliRunner().invoke(cli, ["run", "--config", str(path)]))
    assert len(line.replace(str(path), "FILE")) < SCREEN_LINE and "limit" in line
    # a document within the limit whose value is refused: its error quotes a screen line
    path.write_text(laughs(5, key))  # 59,049 strings
    line = one_error_line(CliRunner().invoke(cli, ["run", "--config", str(path)]))
    assert len(line) < SCREEN_LINE and f"config key '{key}" in line and "must be" in line


@pytest.mark.parametrize(("text", "message"), [
    ("rounds: &a [1, *a]\n", "refers to a value that holds it"),
    ("rounds: " + "[" * 60 + "]" * 60 + "\n", "deeper than the limit of 50 levels"),
    ("rounds: 1\n" + "#" * MAX_YAML_BYTES + "\n", "larger than the limit of 1 MiB"),
])
def test_yaml_recursion_depth_and_size_are_bounded(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    line = one_error_line(CliRunner().invoke(cli, ["run", "--config", str(path)]))
    assert message in line and len(line) < SCREEN_LINE


def test_set_values_are_parsed_and_refused_as_config_files_are(tmp_path):
    marker = tmp_path / "ran"
    tag = f'!!python/object/apply:os.system ["touch {marker}"]'
    path = tmp_path / "tag.yaml"
    path.write_text(f"dataset: {tag}\n")
    from_file = one_error_line(CliRunner().invoke(cli, ["run", "--config", str(path)]))
    from_set = one_error_line(CliRunner().invoke(cli, ["run", "--set", f"dataset={tag}"]))
    assert not marker.exists()
    reason = "is not valid YAML: could not determine a constructor for the tag"
    assert reason in from_file and reason in from_set and from_set.startswith(
        "raydg: error: --set dataset ")
    # the same loader: the same limits, the same values
    one = one_error_line(CliRunner().invoke(cli, ["run", "digits-style", "--set",
                                                  "rounds=&a [1, *a]"]))
    assert "refers to a value that holds it" in one
    path.write_text("rounds: 3\noptions: {mu: 0.5}\nseeds: [1, 2]\n")
    assert parse_sets(["rounds=3", "options={mu: 0.5}", "seeds=[1, 2]"]) == load_yaml(path)


def refused_before(monkeypatch, *names: str) -> None:
    """Make each named step of an experiment (``load``: the data, :class:`DataSpec`'s;
    ``check_federations``: every partition planned, :mod:`raydg.prepare`'s; ``ray_session``:
    Ray, :mod:`raydg.session`'s) fail the test if it runs, in the planning child too (forked
    from this process)."""
    import raydg.prepare
    import raydg.session
    from raydg.datasets import DataSpec

    def ran(*_args, **_kwargs):
        raise AssertionError("bad input reached work it should have been refused before")

    owners = {"load": DataSpec, "ray_session": raydg.session}
    for name in names:
        monkeypatch.setattr(owners.get(name, raydg.prepare), name, ran)


def test_a_population_beyond_memory_is_refused_before_loading_or_planning(monkeypatch):
    for args in ([], ["--client-size", "10"]):
        with bounded(seconds=5, mib=20), pytest.raises(RaydgError) as err:
            resolve(RunConfig(dataset="digits-style", clients=10**9,
                              client_size=int(args[1]) if args else None))
        assert "--clients 1000000000" in str(err.value) and "available here" in str(err.value)
    refused_before(monkeypatch, "load", "check_federations", "ray_session")
    line = one_error_line(CliRunner().invoke(cli, [
        "run", "digits-style", "--target", "sketch", "--rounds", "1", "--clients", "1000000000",
        "--client-size", "10"]))
    assert "GiB of memory" in line and "use at most" in line and len(line) < SCREEN_LINE
    # a cross-device population that fits is planned as before
    cfg = resolve(RunConfig(dataset="digits-style", clients=10_000, client_size=20))
    assert cfg.clients == 10_000


def test_seeds_are_bounded_by_what_every_library_takes(tmp_path, monkeypatch):
    import pyarrow as pa
    import torch

    top = seeding.MAX_SEED
    assert pa.Table.from_pylist([{"seed": top}]).column("seed").type == pa.int64()
    with pytest.raises(OverflowError):  # what MLflow's results tables would meet
        pa.Table.from_pylist([{"seed": top + 1}])
    with pytest.raises(ValueError):
        np.random.SeedSequence([-1])
    seeding.numpy_rng(top, 1).integers(2)
    torch.manual_seed(seeding.derive_seed(top, 1))
    assert resolve(RunConfig(dataset="digits-style", seeds=[0, top])).seeds == [0, top]
    refused_before(monkeypatch, "load", "ray_session")
    for seed in (str(10**30), "-1", str(top + 1)):
        line = one_error_line(CliRunner().invoke(cli, [
            "run", "digits-style", "--target", "sketch", "--seed", seed]))
        assert line.endswith(f"config key 'seeds[0]' must be integers from 0 to 2**63 - 1, "
                             f"which numpy, torch and MLflow's tables all take, not {seed}")
    path = tmp_path / "sweep.yaml"
    path.write_text("dataset: digits-style\nrandom: {samples: 2, seed: -5, space: "
                    "{lr: {uniform: [0.01, 0.1]}}}\n")
    assert one_error_line(CliRunner().invoke(cli, ["sweep", str(path)])).endswith(
        "search key 'random.seed' must be integers from 0 to 2**63 - 1, which numpy, torch and "
        "MLflow's tables all take, not -5")


PACS = ("art_painting", "cartoon", "photo", "sketch")


def pacs_tree(root: Path) -> Path:
    """A small PACS: 2 classes x 3 images per domain; returns the cartoon/dog folder."""
    for d in PACS:
        for c, colour in (("dog", (200, 40, 40)), ("horse", (40, 40, 200))):
            folder = root / "PACS" / d / c
            folder.mkdir(parents=True)
            for i in range(3):
                Image.new("RGB", (9, 9), (colour[0], 20 * i, colour[2])).save(folder / f"{i}.png")
    return root / "PACS" / "cartoon" / "dog"


def link_loop(folder: Path) -> str:
    os.symlink("b.png", folder / "a.png")
    os.symlink("a.png", folder / "b.png")
    return "a.png: Too many levels of symbolic links"


def fifo(folder: Path) -> str:
    os.mkfifo(folder / "f.png")  # opened for reading, it would block until a writer comes
    return "f.png: not a regular file but a FIFO"


def unreadable_folder(folder: Path, monkeypatch) -> str:
    """The class folder ``photo/dog`` cannot be listed (``chmod 000`` does not stop root, so
    listing it raises as it would for anyone else)."""
    locked = folder.parent.parent / "photo" / "dog"
    listing = Path.iterdir

    def iterdir(self):
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    return f"folder {locked}: Permission denied"


@pytest.mark.parametrize("make", [link_loop, fifo, unreadable_folder])
def test_unreadable_entries_are_named_or_skipped_alike_with_and_without_the_cache(
        tmp_path, monkeypatch, make):
    folder = pacs_tree(tmp_path / "data")
    args = (folder, monkeypatch) if make is unreadable_folder else (folder,)
    named = make(*args)
    root = str(tmp_path / "data")
    for cache in (None, tmp_path / "cache"):
        with bounded(seconds=20, mib=50), pytest.raises(RaydgError) as err:
            load_dataset("pacs", root, 8, log=lambda _: None, cache=cache)
        assert named in str(err.value) and "--skip-bad-images" in str(err.value)
        assert "\n" not in str(err.value)
    loaded = []
    for cache in (None, tmp_path / "cache"):
        said: list[str] = []
        with bounded(seconds=20, mib=50), contextlib.ExitStack() as stack:
            if make is unreadable_folder:  # skipped, photo has no dog left: refused
                stack.enter_context(pytest.raises(RaydgError, match=r"'photo' has no images "
                                                                    r"of class\(es\) \['dog'\]"))
            loaded.append(load_dataset("pacs", root, 8, skip_bad=True, log=said.append,
                                       cache=cache))
        assert [line for line in said if "skipped" in line] == [{
            link_loop: "pacs/cartoon: skipped 2 unreadable image(s) of 8",
            fifo: "pacs/cartoon: skipped 1 unreadable image(s) of 7",
            unreadable_folder: f"pacs/photo: skipped the unreadable {named}"}[make]]
    if make is unreadable_folder:
        return
    plain, cached = loaded
    assert [len(d) for d in plain.domains] == [6, 6, 6, 6]
    for a, b in zip(plain.domains, cached.domains, strict=True):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)


def test_a_link_loop_is_one_line_from_the_command(tmp_path, monkeypatch):
    link_loop(pacs_tree(tmp_path / "data"))
    refused_before(monkeypatch, "ray_session")
    result = CliRunner().invoke(cli, [
        "run", "pacs", "--data-root", str(tmp_path / "data"), "--cache-dir",
        str(tmp_path / "cache"), "--target", "sketch", "--image-size", "8", "--model", "cnn",
        "--no-pretrained"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "a.png: Too many levels of symbolic links" in lines[0]


def raydg(args: list[str], env: dict[str, str]) -> tuple[int, list[str], float]:
    """``raydg ARGS`` in a process of its own: exit code, lines printed, seconds."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "raydg", *args], env=env, capture_output=True,
                          text=True, timeout=120)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, lines, time.perf_counter() - start


def token_head(home: Path, temp_dir: str, token: str) -> tuple[subprocess.Popen, int]:
    """``ray start --head --block`` with token authentication on free ports, in ``temp_dir``,
    ``home`` as its HOME (no token file of this machine's user is seen); once up: its process
    and port."""
    names = ("port", "dashboard-agent-listen-port", "ray-client-server-port",
             "metrics-export-port", "dashboard-port")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", "--num-cpus=1",
         "--include-dashboard=false", f"--temp-dir={temp_dir}",
         *(f"--{name}={port}" for name, port in ports.items())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    try:
        wait_for_head(head)
    except BaseException:
        stop_ray_start(head, timeout=30)
        raise
    return head, ports["port"]


@pytest.mark.slow
def test_joining_a_token_protected_cluster_without_its_token_is_one_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    temp_dir = tempfile.TemporaryDirectory(prefix="rt", dir="/tmp",  # short: Unix sockets
                                           ignore_cleanup_errors=True)
    head, port = token_head(home, temp_dir.name, uuid.uuid4().hex)
    try:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH",
                            "RAY_ADDRESS")}
        env["HOME"] = str(home)
        args = ["run", "digits-style", "--target", "sketch", "--rounds", "1", "--address",
                f"127.0.0.1:{port}"]
        checks: list[tuple[dict[str, str], Callable[[str], bool]]] = [
            ({}, lambda line: "it uses token authentication; set RAY_AUTH_MODE=token" in line),
            ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex},
             lambda line: "it refused this process's token" in line),
            ({"RAY_AUTH_MODE": "token"}, lambda line: "no token is set here" in line),
        ]
        for extra, says in checks:
            code, lines, seconds = raydg(args, {**env, **extra})
            assert code == 2 and len(lines) == 1, lines
            assert lines[0].startswith(f"raydg: error: cannot join the Ray cluster at "
                                       f"127.0.0.1:{port}") and says(lines[0]), lines
            assert "RAY_AUTH_TOKEN" in lines[0] and "ray get-auth-token" in lines[0]
            assert seconds < 30  # Ray's own client retries for 20 s first
    finally:
        stop_ray_start(head, timeout=30)
        temp_dir.cleanup()
