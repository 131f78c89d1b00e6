"""Operating a store: health checks, garbage collection, latency probes."""
