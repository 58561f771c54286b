"""FedAvg: the base :class:`Method` unchanged (McMahan et al., 2017; FedFD-A §3.1)."""

from raydg.methods import Method, register

register()(Method)
