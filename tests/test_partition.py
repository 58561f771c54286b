"""Client construction: exact-once assignment, reproducibility, skew, target isolation."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.partition import (
    Partition,
    clients_per_domain,
    draw_shards,
    make_clients,
    split_dirichlet,
    split_iid,
    train_val_split,
)


def _labels(n_per_class: int = 60, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


@pytest.mark.parametrize("alpha", [0.1, 0.5, 10.0])
def test_dirichlet_assigns_every_sample_exactly_once(alpha):
    y = _labels()
    shards = split_dirichlet(y, 5, alpha, np.random.default_rng(1))
    joined = np.concatenate(shards)
    assert len(joined) == len(y)
    np.testing.assert_array_equal(np.sort(joined), np.arange(len(y)))
    assert min(len(s) for s in shards) >= 10


def test_dirichlet_is_reproducible_by_seed():
    y = _labels()
    a = split_dirichlet(y, 4, 0.5, np.random.default_rng(7))
    b = split_dirichlet(y, 4, 0.5, np.random.default_rng(7))
    c = split_dirichlet(y, 4, 0.5, np.random.default_rng(8))
    assert all(np.array_equal(x, z) for x, z in zip(a, b, strict=True))
    assert not all(np.array_equal(x, z) for x, z in zip(a, c, strict=True))


def _skew(y: np.ndarray, shards: list[np.ndarray]) -> float:
    """Mean total-variation distance between each shard's label distribution and the whole's."""
    whole = np.bincount(y, minlength=10) / len(y)
    return float(np.mean([0.5 * np.abs(np.bincount(y[s], minlength=10) / len(s) - whole).sum()
                          for s in shards]))


def test_dirichlet_grows_more_skewed_as_alpha_falls():
    y = _labels(100)
    skew = {a: np.mean([_skew(y, split_dirichlet(y, 5, a, np.random.default_rng(s)))
                        for s in range(10)]) for a in (100.0, 1.0, 0.1)}
    assert skew[100.0] < skew[1.0] < skew[0.1]
    assert skew[100.0] < 0.1 and skew[0.1] > 0.5


@pytest.mark.parametrize("alpha", [None, 0.1])
def test_drawn_clients_hold_distinct_samples_and_may_outnumber_the_data(alpha):
    y = _labels(30)  # 300 samples, 1,000 clients of 20
    shards = draw_shards(y, 1000, 20, alpha, np.random.default_rng(4))
    assert len(shards) == 1000
    for s in shards:
        assert len(np.unique(s)) == 20 and s.min() >= 0 and s.max() < len(y)
    again = draw_shards(y, 1000, 20, alpha, np.random.default_rng(4))
    assert all(np.array_equal(a, b) for a, b in zip(shards, again, strict=True))
    counts = np.bincount(np.concatenate(shards), minlength=len(y))
    if alpha is None:  # every sample equally likely: 1000 * 20 / 300 draws each, binomial
        expected = 1000 * 20 / len(y)
        assert 0.5 * expected < counts.min() and counts.max() < 1.5 * expected
        assert _skew(y, shards) < 0.35
    else:
        assert _skew(y, shards) > 0.5  # Dir(0.1) label shares: a few classes per client
    with pytest.raises(RaydgError, match="more than a source domain's 300 samples"):
        draw_shards(y, 2, 301, alpha, np.random.default_rng(0))


def test_ten_thousand_drawn_clients_keep_to_their_source_domains():
    data = load_dataset("digits-style", None, None)
    clients = make_clients(data, Partition("sketch", 10_000, 0.1, 0.1, seed=0, client_size=20))
    assert len(clients) == 10_000 and [c.client_id for c in clients] == list(range(10_000))
    assert {c.domain for c in clients} == {"plain", "colour-inverted", "texture"}
    assert all(len(c.train_y) + len(c.val_y) == 20 for c in clients)
    assert sum(c.domain == "plain" for c in clients) == 3334  # clients_per_domain(10000, 3)


def test_iid_split_is_stratified_and_balanced():
    y = _labels(33)
    shards = split_iid(y, 4, np.random.default_rng(0))
    np.testing.assert_array_equal(np.sort(np.concatenate(shards)), np.arange(len(y)))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for s in shards:
        assert np.bincount(y[s], minlength=10).min() >= 8  # 33 per class over 4 shards


def test_clients_per_domain_and_val_split():
    assert clients_per_domain(30, 3) == [10, 10, 10]
    assert clients_per_domain(7, 3) == [3, 2, 2]
    with pytest.raises(RaydgError):
        clients_per_domain(2, 3)
    tr, va = train_val_split(50, 0.1, np.random.default_rng(0))
    assert len(va) == 5 and len(tr) == 45 and not set(tr) & set(va)


def _hashes(x: np.ndarray, y: np.ndarray) -> list[str]:
    pairs = zip(x, y, strict=True)
    return [hashlib.sha1(xi.tobytes() + bytes([yi])).hexdigest() for xi, yi in pairs]


@pytest.mark.parametrize(("dataset", "target"), [("digits-style", "sketch"), ("digits-rot", "M0")])
def test_no_target_sample_reaches_a_client(dataset, target):
    data = load_dataset(dataset, None, None)
    clients = make_clients(data, Partition(target, 10, 0.5, 0.1, seed=3))
    target_hashes = set(_hashes(data.domain(target).x, data.domain(target).y))
    seen: list[str] = []
    for c in clients:
        assert c.domain != target
        own = set(_hashes(data.domain(c.domain).x, data.domain(c.domain).y))
        for h in _hashes(c.train_x, c.train_y) + _hashes(c.val_x, c.val_y):
            assert h in own and h not in target_hashes
            seen.append(h)
    # every source sample is used exactly once across clients
    sources = [d for d in data.domains if d.name != target]
    assert sorted(seen) == sorted(h for d in sources for h in _hashes(d.x, d.y))
