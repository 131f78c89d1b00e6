"""``agentq demo``: a worker killed at the worst moment, and the thread finishing anyway."""

from __future__ import annotations

import click


@click.command(short_help="Watch a thread survive a SIGKILLed worker (~10 s).")
@click.option(
    "--redis",
    "redis_url",
    envvar="AGENTQ_REDIS_URL",
    metavar="URL",
    help="Run on this Redis (store and broker) instead of the embedded SQLite "
    "store and filesystem broker [env AGENTQ_REDIS_URL].",
)
@click.option(
    "--keep", is_flag=True, help="Keep the demo's data afterwards and print how to explore it."
)
def demo(redis_url: str | None, keep: bool) -> None:
    """Run a support agent on a real Celery worker, SIGKILL the worker right after the
    agent issued a refund and before that was recorded, and watch a fresh worker resume
    the thread from its checkpoint, without refunding twice. No network, ~10 seconds."""
    from agentq.demo.runner import run_demo

    code = run_demo(redis_url=redis_url, keep=keep)
    if code:
        raise click.exceptions.Exit(code)
