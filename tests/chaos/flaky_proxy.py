"""A TCP proxy in front of ``redis-server`` that loses or delays chosen replies or drops
chosen commands, to reproduce exactly what a store restart, a network cut or a frozen
process does to one call.

redis-py (8.x) retries a command whose connection broke (``Retry`` with 10 attempts by
default), so a reply lost after the server executed the command makes the client send it
again; a command that fails on every attempt surfaces as ``redis.ConnectionError``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class FlakyProxy:
    """Forwards ``127.0.0.1:<port>`` to the server, except:

    ``lose_reply_to``: the next request containing these bytes reaches the server, but its
    reply is not passed on; the client's connection is closed instead (one-shot).
    ``delay_reply_to``: the next request containing these bytes reaches the server, but its
    reply is passed on only ``reply_delay`` seconds later, as a process frozen before
    reading it would see it (one-shot).
    ``drop``: every request containing these bytes closes the client's connection without
    reaching the server.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.lose_reply_to: bytes | None = None
        self.drop: bytes | None = None
        self.delay_reply_to: bytes | None = None
        self.reply_delay = 0.0
        self.lost = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="flaky-proxy", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, server]
            lose, late = threading.Event(), threading.Event()
            for pump in (self._up, self._down):
                threading.Thread(
                    target=pump, args=(client, server, lose, late), daemon=True
                ).start()

    def _up(
        self,
        client: socket.socket,
        server: socket.socket,
        lose: threading.Event,
        late: threading.Event,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self.drop is not None and self.drop in data:
                        self.dropped += 1
                        break
                    if self.lose_reply_to is not None and self.lose_reply_to in data:
                        self.lose_reply_to = None
                        lose.set()
                    if self.delay_reply_to is not None and self.delay_reply_to in data:
                        self.delay_reply_to = None
                        late.set()
                server.sendall(data)
        self._close(client, server)

    def _down(
        self,
        client: socket.socket,
        server: socket.socket,
        lose: threading.Event,
        late: threading.Event,
    ) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if lose.is_set():
                    with self._lock:
                        self.lost += 1
                    break
                if late.is_set():
                    late.clear()
                    time.sleep(self.reply_delay)  # the frozen reader: simulated, not a wait
                client.sendall(data)
        self._close(client, server)

    @staticmethod
    def _close(*sockets: socket.socket) -> None:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            sockets, self._sockets = self._sockets, []
        self._close(*sockets)
