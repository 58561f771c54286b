"""Every augmentation and aggregation rule composed onto FedAvg against the contract of the
engine (:mod:`tests.conformance`): on 1 and on 2 client actors the same weights and curves, bit
for bit; each learns."""

from __future__ import annotations

import pytest

from tests.conformance import check_identical, check_learns, run_searches

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]
SEARCHED = ["augment", "aggregation"]


@pytest.fixture(scope="module")
def runs():
    return run_searches(SEARCHED)


@pytest.mark.parametrize("search", SEARCHED)
def test_one_and_two_actors_give_bit_identical_results(runs, search):
    check_identical(runs, search)


@pytest.mark.parametrize("search", SEARCHED)
def test_every_method_learns(runs, search):
    check_learns(runs, search)
