"""Run as ``python -m tests.engine.gevent_keeper_kill_script STORE_URL PREFIX``: under
gevent, ``revoke(terminate=True)`` kills the task's greenlet (``gevent.kill``) wherever it
is; here, while its driver starts the process's lease keeper, which yields to the hub.
Prints whether another worker could take the thread over once its lease ran out."""

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

from agentq.engine.lease import LeaseKeeper  # noqa: E402
from agentq.errors import LeaseHeld  # noqa: E402
from agentq.store.redis.store import RedisStore  # noqa: E402

TTL = 1.0


def main(url: str, prefix: str) -> None:
    with RedisStore.from_url(url, prefix=prefix) as store:
        store.open_thread("t1", task="agent")
        token = store.acquire("t1", "w1", TTL)
        keeper = LeaseKeeper(store)  # idle: the first lease held starts its thread

        in_node = []

        def drive() -> None:
            with keeper.hold("t1", "w1", token, TTL):
                in_node.append(True)
                gevent.sleep(60)  # the node

        driver = gevent.spawn(drive)
        gevent.sleep(0)  # the driver runs until it waits for the keeper's thread to start
        driver.kill()
        print("killed", "in the node" if in_node else "starting the keeper", flush=True)
        # Nobody drives the thread now: its lease must run out within its TTL.
        deadline = time.monotonic() + 5 * TTL
        while time.monotonic() < deadline:
            try:
                store.acquire("t1", "w2", TTL)
            except LeaseHeld:
                gevent.sleep(0.1)
            else:
                print("TAKEN OVER", flush=True)
                return
        print("STILL HELD", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
