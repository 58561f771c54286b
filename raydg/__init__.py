"""raydg: a Ray-based parallel simulator for federated domain generalization."""

__version__ = "0.1.0"
