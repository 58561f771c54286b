"""Name -> object registries for methods, datasets and models (one entry per module,
DomainBed-style). Each entry remembers its origin: ``built-in``, or the plugin
(:mod:`raydg.plugins`) whose import registered it."""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from raydg.errors import RaydgError

T = TypeVar("T")
BUILT_IN = "built-in"
_origin = [BUILT_IN]  # what registers now: raydg itself, or the plugin being imported
_registries: list[Registry] = []


@contextlib.contextmanager
def registering_as(origin: str) -> Iterator[None]:
    """Entries registered inside come from ``origin``; if the block fails, they are removed
    from every registry again (a plugin that fails to import leaves nothing behind)."""
    _origin.append(origin)
    try:
        yield
    except BaseException:
        for registry in _registries:
            registry.remove(origin)
        raise
    finally:
        _origin.pop()


class Registry(Generic[T]):
    """A case-insensitive mapping from names (and aliases) to registered objects."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}
        self._origins: dict[str, str] = {}
        _registries.append(self)

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            origin = _origin[-1]
            for key in (name, *aliases):
                taken = self._aliases.get(key.lower())
                if taken is not None:
                    raise RaydgError(f"{self.kind} {key!r} is already registered "
                                     f"({self._origins[taken]})")
            for key in (name, *aliases):
                self._aliases[key.lower()] = name
            self._entries[name] = obj
            self._origins[name] = origin
            return obj

        return add

    def remove(self, origin: str) -> None:
        """Forget every entry that ``origin`` registered."""
        for name in [n for n, o in self._origins.items() if o == origin]:
            del self._entries[name], self._origins[name]
            self._aliases = {a: c for a, c in self._aliases.items() if c != name}

    def get(self, name: str) -> T:
        canonical = self._aliases.get(name.lower())
        if canonical is None:
            close = difflib.get_close_matches(name.lower(), list(self._aliases), n=1, cutoff=0.7)
            hint = (f"did you mean {self._aliases[close[0]]}? (raydg list {self.kind}s)" if close
                    else f"valid {self.kind}s: {', '.join(self.names())}")
            raise RaydgError(f"unknown {self.kind} {name!r}; {hint}")
        return self._entries[canonical]

    def origin(self, name: str) -> str:
        """``built-in`` or the plugin that registered ``name``."""
        return self._origins[self._aliases[name.lower()]]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def aliases(self, name: str) -> list[str]:
        return sorted(a for a, c in self._aliases.items() if c == name and a != name.lower())

    def __iter__(self) -> Iterator[tuple[str, T]]:
        return iter(sorted(self._entries.items()))
