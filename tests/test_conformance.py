"""Every training method against the contract of the engine (:mod:`tests.conformance`): on 1
and on 2 client actors the same weights and curves, bit for bit; each learns (its reported mode
at least twice chance on a held-out domain close to its sources); an unknown option is refused;
its ``paper`` names a citation."""

from __future__ import annotations

import re

import pytest

from raydg.errors import RaydgError
from raydg.methods import METHODS
from tests.conformance import check_identical, check_learns, run_searches

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


@pytest.fixture(scope="module")
def runs():
    return run_searches(["methods"])


def test_one_and_two_actors_give_bit_identical_results(runs):
    check_identical(runs, "methods")


def test_every_method_learns(runs):
    check_learns(runs, "methods")


@pytest.mark.parametrize("name", [n for n, _ in METHODS])
def test_unknown_options_are_refused_and_the_paper_is_cited(name):
    cls = METHODS.get(name)
    with pytest.raises(RaydgError, match="no_such_option"):
        cls.parse_options({"no_such_option": 1})
    assert re.search(r"(19|20)\d\d|DomainBed|bound", cls.paper), cls.paper
    assert cls.__doc__ and cls.__doc__.strip(), f"{name} has no docstring"

