"""Agent steps per second through ``AgentTask`` on a real worker, against the same loop
without agentq, against bare Celery tasks; and the cost of one step outside its node.

Run from the repository root::

    python -m bench.agent [--quick]

One ``celery worker -P prefork -c 2`` subprocess, the machine's Redis as broker (a queue of
the run's own), a private redis-server with AOF always as the store (see
:mod:`bench._cluster`). Three workloads of the same size, in rounds that alternate their
order:

- **agent**: T threads of S steps of ``StepsAgent`` (a model node that answers at once and
  a tools node, append-only ``messages``): every step a fenced checkpoint commit;
- **raw SET loop**: T plain Celery tasks each running the same S steps of the same fake
  model, writing one raw ``SET`` of the msgpack'd state per step to the same store;
- **bare Celery**: T*S no-op tasks (each only ``INCR``\\s a counter in a non-persistent
  ledger so the benchmark sees it finish).

Throughput is units finished ÷ time from the first send to the last completion. Each
ratio is taken within a round (its workloads run back to back, so a busy moment on the
machine weighs on both sides), and the median over rounds is reported; the rates shown
are medians (min-max). Target: agent ÷ raw SET loop ≥ 0.8.

The same two at scale: 1000 threads of 20 steps (agent ÷ raw SET loop, median of the rounds'
ratios; target ≥ 0.95), where the per-thread costs (opening it on ``delay()``, its lease,
reading it back) weigh on 20 steps only.

Then the per-step overhead at a ~10 KB state, timed inside the worker between consecutive
step starts: an ``OverheadAgent`` thread whose node does nothing (no append-only field, so
each step commits the whole state: the commit with its fsync, lease, loop: everything but
the node) against a plain task running the same loop with one raw ``SET`` of the state per
step, in alternating blocks. Target ≤ 0.5 ms for the agent's step; the part beyond the raw
SET step (median over the paired blocks) is shown below it, target ≤ 0.05 ms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgpack

from agentq import Status
from bench._cluster import Cluster, broker_problem, cluster, wait_for
from bench._report import (
    Result,
    Target,
    exit_with,
    median,
    millis,
    quantile,
    skipped,
    standalone,
)

TARGET_RAW = Target(0.8, at_most=False)
TARGET_OVERHEAD_MS = Target(0.5)
TARGET_BEYOND_SET_MS = Target(0.05)
STATE_BYTES = 10 * 1024


@dataclass(frozen=True)
class Size:
    threads: int
    steps: int
    rounds: int
    overhead_blocks: int
    overhead_steps: int


SIZES = {False: Size(40, 50, 7, 10, 200), True: Size(10, 20, 1, 2, 100)}
SCALE = {False: Size(1000, 20, 3, 0, 0), True: Size(100, 20, 1, 0, 0)}
TARGET_SCALE = Target(0.95, at_most=False)


def _agent(env: Cluster, size: Size, tag: str) -> int:
    agent = env.task("bench.steps_agent")
    target = env.done_threads() + size.threads
    for k in range(size.threads):
        agent.delay(f"{tag}-{k}", steps=size.steps)
    wait_for(lambda: env.done_threads() >= target, 300, "agent threads done")
    return size.threads * size.steps


def _raw(env: Cluster, size: Size, tag: str) -> int:
    task, counter = env.task("bench.raw_loop"), f"raw:{tag}"
    for k in range(size.threads):
        task.delay(f"raw:{tag}:{k}", size.steps, counter)
    wait_for(lambda: env.count(counter) >= size.threads, 300, "raw loops done")
    return size.threads * size.steps


def _bare(env: Cluster, size: Size, tag: str) -> int:
    task, counter, total = env.task("bench.noop"), f"noop:{tag}", size.threads * size.steps
    for _ in range(total):
        task.delay(counter)
    wait_for(lambda: env.count(counter) >= total, 300, "no-op tasks done")
    return total


WORKLOADS = {"agent": _agent, "raw": _raw, "bare": _bare}


def throughput(
    env: Cluster, size: Size, names: tuple[str, ...] = tuple(WORKLOADS), tag: str = "r"
) -> dict[str, list[float]]:
    """Units per second of each workload, one value per round."""
    workloads = {name: WORKLOADS[name] for name in names}
    rates: dict[str, list[float]] = {name: [] for name in workloads}
    warm = Size(8, 8, 1, 0, 0)
    for name, workload in workloads.items():  # imports, connections, scripts, both children
        workload(env, warm, f"warm-{tag}-{name}")
    for turn in range(size.rounds):
        order = list(workloads.items())
        if turn % 2:
            order.reverse()
        for name, workload in order:
            started = time.perf_counter()
            units = workload(env, size, f"{tag}{turn}-{name}")
            rates[name].append(units / (time.perf_counter() - started))
    return rates


def _overhead_block(env: Cluster, size: Size, block: int) -> list[float]:
    agent, thread_id = env.task("bench.overhead_agent"), f"overhead-{block}"
    agent.delay(thread_id, steps=size.overhead_steps, state_bytes=STATE_BYTES)
    wait_for(
        lambda: agent.thread(thread_id).status == Status.DONE,
        300,
        "the overhead thread done",
        interval=0.02,
    )
    steps: list[float] = agent.thread(thread_id).result
    return steps


def _raw_block(env: Cluster, size: Size, block: int) -> list[float]:
    out = f"raw-ticks:{block}"
    env.task("bench.raw_ticks").delay(f"raw10k:{block}", size.overhead_steps, STATE_BYTES, out)
    wait_for(lambda: env.ledger.llen(out) > 0, 300, "the raw SET loop done", interval=0.02)
    steps: list[float] = msgpack.unpackb(env.ledger.lindex(out, 0))
    return steps


def step_overhead(env: Cluster, size: Size) -> tuple[list[list[float]], list[list[float]]]:
    """Seconds per step of a zero-latency agent node and of a raw SET loop at 10 KB, both
    timed inside the worker, in alternating blocks (one list of steps per block)."""
    agent: list[list[float]] = []
    raw: list[list[float]] = []
    for block in range(size.overhead_blocks):
        pair = ((agent, _overhead_block), (raw, _raw_block))
        for out, measure in pair if block % 2 == 0 else pair[::-1]:
            out.append(measure(env, size, block))
    return agent, raw


def _spread(values: list[float], unit: str = "/s", scale: float = 1.0) -> str:
    mid = median(values) * scale
    if len(values) == 1:
        return f"{mid:.0f}{unit}"
    return f"{mid:.0f}{unit} ({min(values) * scale:.0f}-{max(values) * scale:.0f})"


def run(quick: bool) -> list[Result]:
    problem = broker_problem()
    if problem:
        return [
            skipped(
                "ratio", "agent_steps_over_raw_set_loop", "agent steps/s ÷ raw SET loop", problem
            ),
            skipped(
                "ratio", "agent_steps_over_celery_tasks", "agent steps/s ÷ bare Celery", problem
            ),
            skipped("ratio", "agent_steps_over_raw_at_scale", "same at scale", problem),
            skipped("figure", "agent_step_overhead_ms_10k", "AgentTask step, 10 KB", problem),
        ]
    size = SIZES[quick]
    with cluster(concurrency=2) as env:
        rates = throughput(env, size)
        scale = SCALE[quick]
        at_scale = throughput(env, scale, ("agent", "raw"), "s")
        agent_blocks, raw_blocks = step_overhead(env, size)
    # Each round's workloads ran back to back: compare within a round, then take the median,
    # so a busy moment on the machine weighs on both sides of a ratio.
    over_raw = median([a / r for a, r in zip(rates["agent"], rates["raw"], strict=True)])
    scaled = median([a / r for a, r in zip(at_scale["agent"], at_scale["raw"], strict=True)])
    over_bare = median([a / b for a, b in zip(rates["agent"], rates["bare"], strict=True)])
    agent_steps = [t for block in agent_blocks for t in block]
    raw_steps = [t for block in raw_blocks for t in block]
    step, put = median(agent_steps), median(raw_steps)
    beyond = median([median(a) - median(r) for a, r in zip(agent_blocks, raw_blocks, strict=True)])
    rounds = f"{size.rounds}x {size.threads} threads x {size.steps} steps"
    return [
        Result(
            "ratio",
            "agent_steps_over_raw_set_loop",
            over_raw,
            f"agent steps/s ÷ raw SET loop, median of {rounds}",
            _spread(rates["agent"]),
            _spread(rates["raw"]),
            TARGET_RAW,
        ),
        Result(
            "ratio",
            "agent_steps_over_celery_tasks",
            over_bare,
            "agent steps/s ÷ bare Celery tasks/s",
            _spread(rates["agent"]),
            _spread(rates["bare"]),
        ),
        Result(
            "ratio",
            "agent_steps_over_raw_at_scale",
            scaled,
            f"same, {scale.rounds}x {scale.threads} threads x {scale.steps} steps",
            _spread(at_scale["agent"]),
            _spread(at_scale["raw"]),
            TARGET_SCALE,
        ),
        Result(
            "figure",
            "agent_step_overhead_ms_10k",
            step * 1e3,
            "AgentTask step, zero-latency node, 10 KB state, ms",
            f"{millis(step)} (p99 {millis(quantile(agent_steps, 0.99))})",
            f"raw SET step {millis(put)}",
            TARGET_OVERHEAD_MS,
            f"{len(agent_steps)} steps timed in the worker",
        ),
        Result(
            "figure",
            "agent_step_minus_set_ms_10k",
            beyond * 1e3,
            "  of which beyond a raw SET step, ms",
            millis(beyond),
            f"median of {len(agent_blocks)} paired blocks",
            TARGET_BEYOND_SET_MS,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    return standalone("python -m bench.agent", __doc__, run, argv)


if __name__ == "__main__":
    exit_with(main)
