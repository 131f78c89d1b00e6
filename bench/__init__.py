"""Benchmarks for agentq, run from the repository root: all of them with ``python -m bench
[--quick]``, one with ``python -m bench.<name>`` (``store``, ``steps``, ``agent``, ...)."""
