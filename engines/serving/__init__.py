"""Serving the decoder to many stations: the wire, Triton's model, in-flight batching."""
