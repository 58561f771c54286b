"""Method registry. Every module in this package registers its methods on import.

Adding a method means adding one module here (and its test); nothing else changes.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from raydg.errors import RaydgError
from raydg.methods.base import ClientContext, Method, NoOptions, Server, Upload
from raydg.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")


def register(*aliases: str):
    """Class decorator: register a :class:`Method` subclass under its ``name`` and aliases."""

    def add(cls: type[Method]) -> type[Method]:
        return METHODS.register(cls.name, *aliases)(cls)

    return add


def method_class(name: str, augment: str | None = None,
                 aggregation: str | None = None) -> type[Method]:
    """The registered method ``name``, with the augmentation ``augment`` and the aggregation
    rule ``aggregation`` composed in.

    An augmentation (``augmentation = True``, e.g. CCST) or aggregation rule (``aggregation =
    True``, e.g. FedDG-GA) calls ``super()`` in every hook it overrides, so ``class
    Composed(Rule, Augment, Base)`` runs its phases around the base method's; the methods'
    options merge into one dataclass.
    """
    cls = METHODS.get(name)
    if augment is not None:
        cls = _compose(cls, METHODS.get(augment), "augmentation", "--augment")
    if aggregation is not None:
        cls = _compose(cls, METHODS.get(aggregation), "aggregation", "--aggregation")
    return cls


def build(name: str, augment: str | None, aggregation: str | None,
          options: dict[str, Any]) -> Method:
    """The method that runs: :func:`method_class` with ``options`` in their typed form (the
    planning step checked them; a trial and a saved model build it from its record)."""
    cls = method_class(name, augment, aggregation)
    return cls(cls.parse_options(options))


def _compose(base: type[Method], extra: type[Method], role: str, flag: str) -> type[Method]:
    """``class Composed(extra, base)``, named ``base+extra``; ``role`` is the class flag that
    ``extra`` must have and ``base`` must not."""
    if not getattr(extra, role):
        names = ", ".join(n for n, c in METHODS if getattr(c, role))
        raise RaydgError(f"{extra.name} is not an {role} method; {flag} takes: {names}")
    if getattr(base, role):
        raise RaydgError(f"{flag} {extra.name} needs a training method, not {base.name}")
    clash = {f.name for f in dataclasses.fields(base.Options)} & {
        f.name for f in dataclasses.fields(extra.Options)}
    if clash:
        raise RaydgError(f"{base.name} and {extra.name} both have options {sorted(clash)}")
    options = dataclasses.make_dataclass(f"{base.__name__}{extra.__name__}Options", [],
                                         bases=(extra.Options, base.Options))
    return type(f"{base.__name__}{extra.__name__}", (extra, base),
                {"name": f"{base.name}+{extra.name}", "Options": options,
                 "__module__": __name__,
                 "label": classmethod(lambda _, o: f"{base.label(o)}+{extra.label(o)}")})


for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "ClientContext", "Method", "NoOptions", "Server", "Upload", "build",
           "method_class", "register"]
