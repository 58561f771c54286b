"""A Griffe extension for the API reference (mkdocs.yml): raydg's docstrings use reST roles
(:class:`Method`, :func:`~raydg.api.run`) and ``::`` before a literal block; mkdocstrings
renders docstrings as Markdown, so roles become code spans and ``::`` a colon."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:attr|class|data|exc|func|meth|mod|obj):`~?([^`]+)`")
LITERAL = re.compile(r"::$", re.MULTILINE)


class ReSTRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = LITERAL.sub(":", ROLE.sub(r"`\1`", obj.docstring.value))
