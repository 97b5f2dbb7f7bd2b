"""Outputs of a Monitor. Each consumes records; none knows where they came from.

``base``: the protocol and the fan-out; ``factory``: the sinks a config names; one
module per output.
"""
