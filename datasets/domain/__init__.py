"""Domain types every layer above shares: stacks, topology, Flight Recorder dumps, exits, the Inputs bundle.

Light on purpose: numpy at most, never polars or pyarrow.
"""
