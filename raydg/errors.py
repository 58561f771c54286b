"""User-facing errors: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import reprlib
from typing import Any

MAX_LINE = 1000  # characters of an error message, whatever it quotes
QUOTE_CHARS = 80  # characters of a value that an error message quotes

_REPR = reprlib.Repr()  # a large value's repr, built no larger than it prints
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict = 3, 6, 6, 4
_REPR.maxstring = _REPR.maxother = QUOTE_CHARS
_REPR.maxlong = 40


def cut(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text``, cut to ``limit`` characters (``...`` marks the cut)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def quoted(value: Any) -> str:
    """``repr(value)`` in at most ``QUOTE_CHARS`` characters, in time and memory that do not
    grow with ``value`` (a nested list of millions of items, a string of megabytes)."""
    return cut(_REPR.repr(value))


class RaydgError(Exception):
    """Bad input from the user (unknown name, invalid value, missing data); its message is
    one line of at most ``MAX_LINE`` characters."""

    def __init__(self, message: str) -> None:
        super().__init__(cut(" ".join(str(message).splitlines()), MAX_LINE))


class TrackingError(Exception):
    """MLflow calls that still failed at the end of an experiment (the CLI exits with 1)."""


class EmptyResult(Exception):
    """A query that matches nothing, e.g. a report over no finished run (the CLI exits with
    1): not bad input, nothing to show."""
