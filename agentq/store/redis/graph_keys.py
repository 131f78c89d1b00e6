"""The graph store's Redis key layout, beside the store's (:mod:`agentq.store.redis.keys`).

Every key of a thread starts with ``P thread:{T}:lg:`` — the thread's hash tag, so one Lua
script reaches all of them on Redis Cluster too — and is registered in the thread's agentq
``owned`` set, so deleting (or expiring) the agentq thread deletes its LangGraph data in the
same atomic step. ``<ns>`` and ``<id>`` are escaped (``%`` → ``%25``, ``:`` → ``%3A``), so
no part of a key can be mistaken for another.

===========================================  ======  ==========================================
key                                          type    contents
===========================================  ======  ==========================================
``P thread:{T}:lg:ns``                       set     escaped namespaces holding checkpoints
``P thread:{T}:lg:ids:<ns>``                 zset    checkpoint ids, all scored 0: ordered by
                                                     id, which is LangGraph's order
``P thread:{T}:lg:cp:<ns>``                  hash    id -> record (checkpoint without values,
                                                     metadata, parent id)
``P thread:{T}:lg:refs:<ns>``                hash    id -> the blob fields the checkpoint reads
``P thread:{T}:lg:blob:<ns>``                hash    (channel, version) -> serialised value
``P thread:{T}:lg:w:<ns>:<id>``              hash    (task id, index) -> pending write
``P thread:{T}:lg:wr:<ns>:<id>``             hash    (task id, index) -> the run that made
                                                     the write, where it is not the
                                                     checkpoint's own run
``P thread:{T}:lg:run:<run>``                set     ``<ns>:<id>`` of the run's checkpoints
                                                     (``<id>`` unescaped), and
                                                     ``%writes:<ns>:<id>`` of other runs'
                                                     checkpoints it wrote to
``P lg:{index}:threads``                     set     thread ids holding LangGraph checkpoints
``P lg:{index}:run:<run>``                   set     thread ids holding checkpoints of the run
===========================================  ======  ==========================================

The two global sets are indexes for ``list(None)`` and ``delete_for_runs``: they are added to
before a thread's data is written and cleaned after it is deleted (a write refused because
the thread was deleted meanwhile takes out the entries it made), so they may name a thread
that no longer has data (readers skip it), never miss one. A process remembers the entries
it added; when a put finds the thread's (or the run's) data gone, deleted by another
process, it adds them again right after that put.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agentq.store.redis.keys import Keys

_ESCAPED = re.compile(r"%(25|3A)")


def escape(part: str) -> str:
    return part.replace("%", "%25").replace(":", "%3A")


def unescape(part: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else ":", part)


@dataclass(frozen=True)
class GraphKeys:
    """Builds the graph store's key names from the store's
    :class:`~agentq.store.redis.keys.Keys`."""

    keys: Keys

    def base(self, thread_id: str) -> str:
        return f"{self.keys.thread(thread_id)}lg:"

    def namespaces(self, thread_id: str) -> str:
        return f"{self.base(thread_id)}ns"

    def ns_key(self, thread_id: str, kind: str, ns: str) -> str:
        """``kind`` is ``ids``, ``cp``, ``refs`` or ``blob``."""
        return f"{self.base(thread_id)}{kind}:{escape(ns)}"

    def writes(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.base(thread_id)}w:{escape(ns)}:{escape(checkpoint_id)}"

    def run_writes(self, thread_id: str, ns: str, checkpoint_id: str) -> str:
        return f"{self.base(thread_id)}wr:{escape(ns)}:{escape(checkpoint_id)}"

    def run(self, thread_id: str, run_id: str) -> str:
        return f"{self.base(thread_id)}run:{escape(run_id)}"

    def thread_index(self) -> str:
        return f"{self.keys.prefix}lg:{{index}}:threads"

    def run_index(self, run_id: str) -> str:
        return f"{self.keys.prefix}lg:{{index}}:run:{escape(run_id)}"
