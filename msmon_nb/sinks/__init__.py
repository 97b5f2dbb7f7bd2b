"""Outputs of a Monitor. Each consumes records; none knows where they came from."""

from msmon_nb.sinks.base import Fanout, Sink, make_sinks

__all__ = ["Fanout", "Sink", "make_sinks"]
