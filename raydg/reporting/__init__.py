"""Reporting: what stored runs say, read from an MLflow store or a runs file; no Ray, no torch,
no engine module.

:mod:`~raydg.reporting.runs` finds the runs and groups them into tables,
:mod:`~raydg.reporting.report` prints them (``raydg report``), :mod:`~raydg.reporting.rows`
writes and reads runs files, :mod:`~raydg.reporting.pages` regenerates docs pages from them and
:mod:`~raydg.reporting.reproduction` holds a reproduction of a published table.
"""
