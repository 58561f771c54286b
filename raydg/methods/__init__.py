"""Method registry. Every module in this package registers its methods on import.

Adding a method means adding one module here (and its test); nothing else changes.
"""

from __future__ import annotations

import importlib
import pkgutil

from raydg.methods.base import ClientContext, Method, NoOptions, Server, Upload
from raydg.registry import Registry

METHODS: Registry[type[Method]] = Registry("method")


def register(*aliases: str):
    """Class decorator: register a :class:`Method` subclass under its ``name`` and aliases."""

    def add(cls: type[Method]) -> type[Method]:
        return METHODS.register(cls.name, *aliases)(cls)

    return add


for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "ClientContext", "Method", "NoOptions", "Server", "Upload", "register"]
