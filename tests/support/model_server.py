"""A stand-in for a model API over HTTP: answers every ``POST /v1/chat`` with JSON after
a fixed latency, counting each call by the ``thread`` and ``call`` it names.

Run as ``python -m tests.support.model_server PORT LATENCY``; ``GET /calls`` returns the
counts as ``{"<thread>/<call>": n}``. A thread per connection, as a real API serves many
connections at once; a backlog for hundreds of clients connecting at once (socketserver's
default of 5 drops the rest's SYNs, which the clients send again a second later).
"""

from __future__ import annotations

import collections
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 4096

    def __init__(self, port: int, latency: float) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.latency = latency
        self.calls: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a client's pool expects
    server: ModelServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.calls[f"{body['thread']}/{body['call']}"] += 1
        time.sleep(self.server.latency)  # the model thinking
        self._reply({"content": f"answer {body['call']}", "call": body["call"]})

    def do_GET(self) -> None:
        with self.server.lock:
            calls = dict(self.server.calls)
        self._reply(calls)

    def _reply(self, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # thousands of calls: the counts say what happened


if __name__ == "__main__":
    ModelServer(int(sys.argv[1]), float(sys.argv[2])).serve_forever()
