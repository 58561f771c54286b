"""Method registry. Every module in this package registers its methods on import.

Adding a method means adding one module here (and its test); nothing else changes.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil

from raydg.errors import RaydgError
from raydg.methods.base import ClientContext, Method, NoOptions, Server, Upload
from raydg.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")


def register(*aliases: str):
    """Class decorator: register a :class:`Method` subclass under its ``name`` and aliases."""

    def add(cls: type[Method]) -> type[Method]:
        return METHODS.register(cls.name, *aliases)(cls)

    return add


def method_class(name: str, augment: str | None = None) -> type[Method]:
    """The registered method ``name``, with the augmentation method ``augment`` composed in.

    An augmentation (a method with ``augmentation = True``, e.g. CCST) is written to call
    ``super()`` in every hook it overrides, so ``class Composed(Augment, Base)`` runs its phases
    around the base method's; the two methods' options merge into one dataclass.
    """
    base = METHODS.get(name)
    if augment is None:
        return base
    aug = METHODS.get(augment)
    if not aug.augmentation:
        names = ", ".join(n for n, c in METHODS if c.augmentation)
        raise RaydgError(f"{aug.name} is not an augmentation; augmentations: {names}")
    if base.augmentation:
        raise RaydgError(f"--augment {aug.name} needs a training method, not {base.name}")
    clash = {f.name for f in dataclasses.fields(base.Options)} & {
        f.name for f in dataclasses.fields(aug.Options)}
    if clash:
        raise RaydgError(f"{base.name} and {aug.name} both have options {sorted(clash)}")
    label = f"{base.name}+{aug.name}"
    options = dataclasses.make_dataclass(f"{base.__name__}{aug.__name__}Options", [],
                                         bases=(aug.Options, base.Options))
    return type(f"{base.__name__}{aug.__name__}", (aug, base),
                {"name": label, "Options": options, "__module__": __name__,
                 "label": classmethod(lambda _, o: f"{base.label(o)}+{aug.label(o)}")})


for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "ClientContext", "Method", "NoOptions", "Server", "Upload", "method_class",
           "register"]
