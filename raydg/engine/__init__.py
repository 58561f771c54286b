"""The engine: one federation, from its clients' data to its result, with no Tune in it.

Layers, bottom up: :mod:`~raydg.engine.ledger` (every message's bytes and kind),
:mod:`~raydg.engine.client` (client hosts and the target evaluator, plain objects),
:mod:`~raydg.engine.actors` (those hosts as Ray actors, placement, the pool the driver talks
to; :mod:`~raydg.engine.parking` keeps them warm between federations),
:mod:`~raydg.engine.simulation` (the driver: sampling, aggregation, evaluation, model
selection). A method plugs in through :class:`raydg.methods.Method`; the engine names none.
Tune's side (:mod:`raydg.trials`) runs a :class:`~raydg.engine.simulation.Simulation` as a
trial's function.
"""
