"""MLflow tracking: :mod:`~raydg.tracking.tracker`, the one writer (the process that runs the
experiment); :mod:`~raydg.tracking.store`, where the runs are kept;
:mod:`~raydg.tracking.logged_model`, a federation's model as its child run logs it; and
:mod:`~raydg.tracking.backup`, snapshots of a SQLite store (``raydg store backup|restore``)."""
