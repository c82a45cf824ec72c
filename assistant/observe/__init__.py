"""Observing turns: records, latency statistics, Prometheus metrics, GPU readings."""
