"""Tune's log lines that raydg says itself: kept out of raydg's output, where they would
repeat it in Ray's log format."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Prefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


@contextlib.contextmanager
def without(logger: str, *prefixes: str) -> Iterator[None]:
    """While it lasts, ``logger`` drops the records whose message starts with one of
    ``prefixes`` (every other record passes)."""
    target, quiet = logging.getLogger(logger), _Prefixes(prefixes)
    target.addFilter(quiet)
    try:
        yield
    finally:
        target.removeFilter(quiet)
