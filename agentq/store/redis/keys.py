"""The Redis key layout, in one place.

Braces are literal: ``{<thread_id>}`` is a Redis Cluster hash tag, so every key of one
thread lives in one slot and one Lua script can touch them all. The global indexes share
the ``{index}`` tag for the same reason, and the limits the ``{limits}`` tag, so that one
call takes from all of its limits at once.

=========================================  ======  ===========================================
key                                        type    contents
=========================================  ======  ===========================================
``P thread:{T}:checkpoint:<n>``            string  snapshot n, a msgpack envelope; the last
                                                   ``keep_last`` are kept
``P thread:{T}:latest``                    string  n of the latest snapshot
``P thread:{T}:meta``                      hash    status, step, node, task, attempts,
                                                   crashes, fence, first, error, timestamps,
                                                   input/result/interrupt/resume (msgpack),
                                                   cancel ("1" once requested), log_fields
                                                   (msgpack list of the latest checkpoint's
                                                   append-only fields; absent if none),
                                                   timeout/timeout_at/timed_out (a wait
                                                   for a human's, see meta_fields.py), parked
                                                   (while it waits for a concurrency key: the
                                                   key's queue), lost_token (the token of the
                                                   last take that counted a lost worker),
                                                   canvas_taker (the task that carries its
                                                   canvas on, once one does), request (the
                                                   id of the last reopen, settled effect or
                                                   fork it applied); on
                                                   Redis Cluster also due_at (a Unix time or
                                                   ``clear``) and index_seq (counts its index
                                                   changes), the index entries it should have
``P thread:{T}:staged``                    string  the snapshot of a commit in flight: SET
                                                   in the commit's MULTI, then renamed to its
                                                   checkpoint key, or deleted if the commit
                                                   is refused
``P thread:{T}:lock``                      string  ``<token>:<owner>``, expires with the lease
``P thread:{T}:effect:<key>``              hash    state (pending/done), token, result, and
                                                   while pending the id of the claim
``P thread:{T}:artifact:<sha256>``         string  an artifact's bytes, content-addressed
``P thread:{T}:log:<field>``               list    the items of an append-only state field,
                                                   each msgpack; snapshots record a length
``P thread:{T}:logs``                      set     the fields that have a log, added when
                                                   each log is created
``P thread:{T}:owned``                     set     every effect and artifact key of the
                                                   thread, so that deleting it finds them
``P effect:{<key>}``                       hash    a global (cross-thread) effect record:
                                                   the same fields, and thread (the thread
                                                   that claimed it last)
``P index:{index}:due``                    zset    thread id -> Unix time it is due to run
``P index:{index}:status:<status>``        zset    thread id -> Unix time of its last update
``P index:{index}:synced``                 hash    Redis Cluster only: thread id -> the meta's
                                                   ``index_seq`` the indexes were last set
                                                   from, so an older state never overwrites
                                                   a newer one; ``gc`` reads it for threads
                                                   no longer there (all of it, or with a
                                                   limit the next page)
``P index:{index}:sweeper``                string  the owner of the sweeper lease (PX TTL)
``P index:{index}:claimed``                list    the last claim of due threads: its request
                                                   id, then the ids it took (PX TTL: the
                                                   hold), for a claim sent again
``P limit:{limits}:<key>``                 hash    req_tat, tok_tat (GCRA times), paused
                                                   (Unix time a 429 asked to wait until)
``P limit:{limits}:<key>:holders``         zset    concurrency slot holder -> expiry
``P ckey:{ckeys}:<key>/holders``           hash    concurrency key slots: thread id -> the
                                                   lease token owning it, or ``r`` (reserved
                                                   for a woken thread)
``P ckey:{ckeys}:<key>/queue``             zset    parked thread id -> Unix time parked
``P ckey:{ckeys}:<key>/state``             hash    cap (as last entered), last (the latest
                                                   park time, to keep them increasing)
``P ckey:{ckeys}:active``                  set     the concurrency keys with a slot or a
                                                   waiter
=========================================  ======  ===========================================

``P`` is the configured prefix (``agentq:`` by default). Leases expire through ``PX`` on
the lock keys, the sweeper lease and the last claim of due threads on theirs; no other
key has a Redis TTL: finished threads are removed by ``gc()``, which
also keeps the indexes consistent. A staged snapshot (one over ``INLINE_SNAPSHOT_BYTES``;
smaller ones go to the commit script as an argument) exists only within one MULTI, unless
its script never ran (a server that lost its scripts and then the connection): the
thread's next staged commit overwrites it, deleting the thread deletes it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    """Builds every key name for one prefix."""

    prefix: str = "agentq:"

    def thread(self, thread_id: str) -> str:
        return f"{self.prefix}thread:{{{thread_id}}}:"

    def checkpoint(self, thread_id: str, step: int) -> str:
        return f"{self.thread(thread_id)}checkpoint:{step}"

    def checkpoint_prefix(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}checkpoint:"

    def latest(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}latest"

    def meta(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}meta"

    def staged(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}staged"

    def lock(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}lock"

    def effect(self, thread_id: str, key: str) -> str:
        return f"{self.thread(thread_id)}effect:{key}"

    def artifact(self, thread_id: str, digest: str) -> str:
        return f"{self.thread(thread_id)}artifact:{digest}"

    def log(self, thread_id: str, field: str) -> str:
        return f"{self.thread(thread_id)}log:{field}"

    def owned(self, thread_id: str) -> str:
        return f"{self.thread(thread_id)}owned"

    def global_effect(self, key: str) -> str:
        return f"{self.prefix}effect:{{{key}}}"

    def due(self) -> str:
        return f"{self.prefix}index:{{index}}:due"

    def status_index_prefix(self) -> str:
        return f"{self.prefix}index:{{index}}:status:"

    def status_index(self, status: str) -> str:
        return f"{self.status_index_prefix()}{status}"

    def synced(self) -> str:
        return f"{self.prefix}index:{{index}}:synced"

    def sweeper(self) -> str:
        return f"{self.prefix}index:{{index}}:sweeper"

    def claimed(self) -> str:
        return f"{self.prefix}index:{{index}}:claimed"

    def limit(self, key: str) -> str:
        return f"{self.prefix}limit:{{limits}}:{key}"

    def limit_holders(self, key: str) -> str:
        return f"{self.limit(key)}:holders"

    def thread_key_prefix(self) -> str:
        return f"{self.prefix}ckey:{{ckeys}}:"

    def thread_key(self, key: str, part: str) -> str:
        # '/' cannot be in a key's name, so no key's parts meet another key's name.
        return f"{self.thread_key_prefix()}{key}/{part}"

    def thread_keys_active(self) -> str:
        return f"{self.thread_key_prefix()}active"
