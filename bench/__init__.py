"""Benchmarks for agentq, run as modules from the repository root (``python -m bench.store``)."""
