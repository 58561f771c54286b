"""Command line: ``raydg run``, ``sweep``, ``resume``, ``report``, ``data download|check``,
``doctor``, ``store backup|restore``, ``list`` and ``schema``. Importing it imports neither
torch nor Ray: ``--help`` and ``list`` answer at once.

Precedence of settings: built-in defaults < dataset defaults < ``--config`` YAML
< command-line options < ``--set``.
Bad input prints one ``raydg: error: ...`` line and exits with code 2.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from raydg.cli.experiments import resume, run, sweep
from raydg.cli.options import CONTEXT
from raydg.cli.tools import data, doctor, list_cmd, report, schema, store
from raydg.errors import EmptyResult, RaydgError, TrackingError
from raydg.version import installed_version


class Cli(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RaydgError as err:
            click.echo(f"raydg: error: {err}", err=True)
            ctx.exit(2)
        except TrackingError as err:
            click.echo(f"raydg: error: {err}", err=True)
            ctx.exit(1)
        except EmptyResult as err:
            click.echo(f"raydg: {err}", err=True)
            ctx.exit(1)
        except KeyboardInterrupt as err:
            from raydg.signals import TERMINATED, command, stop_recorded

            recorded = stop_recorded()  # the hint is printed already
            click.echo(f"raydg: interrupted{f' ({err})' if str(err) else ''}", err=True)
            directory = getattr(err, "experiment_dir", None)
            if directory and not recorded:
                click.echo(f"raydg: continue with: {command('raydg')} resume {directory}",
                           err=True)
            ctx.exit(143 if TERMINATED.is_set() else 130)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: raydg's version, looked up only when asked (not at every start)."""
    if value and not ctx.resilient_parsing:
        click.echo(f"raydg, version {installed_version()}")
        ctx.exit()


@click.group(cls=Cli, context_settings=CONTEXT)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_version, help="Show the version and exit.")
def cli() -> None:
    """raydg: parallel simulation of federated domain generalization on Ray."""

for command in (run, sweep, resume, report, data, doctor, store, list_cmd, schema):
    cli.add_command(command)


EXPERIMENTS = ("run", "sweep", "resume", "doctor")  # the commands that start Ray


def _record_stop(running: dict[str, str]) -> None:
    """Record the stop of an experiment whose process ended on SIGTERM before it could (Ray's
    driver ended it): ``running`` is what it told :func:`raydg.signals.detached`'s parent.
    Imports no more than MLflow: a scheduler's SIGKILL comes a few seconds after SIGTERM."""
    from raydg.signals import say_stopped
    from raydg.tracking.store import end_stopped

    try:
        end_stopped(running["tracking_uri"], running["run_id"])
    except Exception as err:  # said, not swallowed: the runs stay as the store has them
        click.echo(f"raydg: error: the runs of MLflow run {running['run_id']} could not be "
                   f"marked KILLED: {type(err).__name__}: {err}", err=True)
    say_stopped(running["experiment_dir"])


def main() -> None:
    """The ``raydg`` command; one that runs an experiment does so in a session of its own
    (:func:`raydg.signals.detached`), so that a signal to the caller's process group reaches
    raydg but not its Ray."""
    if len(sys.argv) > 1 and sys.argv[1] in EXPERIMENTS:
        from raydg.signals import detached

        detached(lambda: cli(prog_name="raydg"), _record_stop)
    cli(prog_name="raydg")
