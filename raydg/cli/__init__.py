"""The ``raydg`` command (:mod:`raydg.cli.app`): the experiments' commands
(:mod:`~raydg.cli.experiments`, their options in :mod:`~raydg.cli.options`) and the tools around
them (:mod:`~raydg.cli.tools`)."""

from raydg.cli.app import cli, main

__all__ = ["cli", "main"]
