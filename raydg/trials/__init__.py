"""Tune's side: federations as Ray Tune trials, which give concurrency, placement and storage.

Every federation (one target x one seed x one setting) is one trial, and the trial's function
(:mod:`~raydg.trials.trial`) is the federation's *driver actor*: it builds the engine's
:class:`~raydg.engine.simulation.Simulation` and runs its rounds inside the trial's actor. The
trial's placement group (:mod:`~raydg.trials.resources`) has a head bundle for the driver, which
also evaluates the global model on the target domain (empty on CPUs: the driver reserves nothing
and runs beside its first client actor; a GPU share otherwise), then one bundle per client
actor, so a trial starts only when all of its resources are free.

:mod:`~raydg.trials.tuner` runs the trials; its callback (:mod:`~raydg.trials.callbacks`), in
the process that calls ``Tuner.fit``, is the one writer to MLflow, prints the console's
progress (:mod:`~raydg.trials.progress`) and loads each finished federation's result;
:mod:`~raydg.trials.storage` names the experiment's folder, writes its manifest and checks its
checkpoints before a resume; :mod:`~raydg.trials.logs` keeps the log lines of Tune's that
raydg says itself out of its output.
"""
