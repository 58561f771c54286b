"""User-facing errors: the CLI prints them as one line and exits with code 2."""


class RaydgError(Exception):
    """Bad input from the user (unknown name, invalid value, missing data)."""
