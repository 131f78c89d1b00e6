"""``python -m agentq``: the ``agentq`` command, for an environment whose scripts are not
on ``PATH`` (as ``python -m celery`` is Celery's)."""

from agentq.cli import main

main()
