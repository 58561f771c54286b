"""Name -> object registries for methods and datasets (one entry per module, DomainBed-style)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from raydg.errors import RaydgError

T = TypeVar("T")


class Registry(Generic[T]):
    """A case-insensitive mapping from names (and aliases) to registered objects."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            for key in (name, *aliases):
                if key.lower() in self._aliases:
                    raise ValueError(f"{self.kind} {key!r} is registered twice")
                self._aliases[key.lower()] = name
            self._entries[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        canonical = self._aliases.get(name.lower())
        if canonical is None:
            raise RaydgError(
                f"unknown {self.kind} {name!r}; valid {self.kind}s: {', '.join(self.names())}"
            )
        return self._entries[canonical]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def aliases(self, name: str) -> list[str]:
        return sorted(a for a, c in self._aliases.items() if c == name and a != name.lower())

    def __iter__(self) -> Iterator[tuple[str, T]]:
        return iter(sorted(self._entries.items()))
