"""agentq on Celery: the task base, app wiring, the worker bootstep, recovery."""
