"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class RaydgError(Exception):
    """Bad input from the user (unknown name, invalid value, missing data)."""


class TrackingError(Exception):
    """MLflow calls that still failed at the end of an experiment (the CLI exits with 1)."""


class EmptyResult(Exception):
    """A query that matches nothing, e.g. a report over no finished run (the CLI exits with
    1): not bad input, nothing to show."""
