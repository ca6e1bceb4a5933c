"""An HTTP reverse proxy that injects storage faults, run as its own process.

    python tests/faultproxy.py UPSTREAM_URL PORT STATS_FILE [--fail R] [--drop R]
        [--lost R] [--seed N]

For each request, with the given probabilities:
  --fail  answer 503 without forwarding (the store throttling or failing);
  --drop  close the connection without answering, before forwarding (a reset);
  --lost  forward it, then close the connection without passing the answer on
          (the request took effect but the client never heard: the hard case for
          exclusive creates).
While the file STATS_FILE.outage exists, the store is down: every request is answered
503, or, if the file says "hang", held unanswered until the file goes (a network that
drops packets), then closed.
Everything else is forwarded unchanged. Counts are rewritten to STATS_FILE as JSON
after every request, so tests can show that faults happened and were retried.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
}


def _outage(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except FileNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("upstream")
    ap.add_argument("port", type=int)
    ap.add_argument("stats")
    ap.add_argument("--fail", type=float, default=0.0)
    ap.add_argument("--drop", type=float, default=0.0)
    ap.add_argument("--lost", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    up = urllib.parse.urlsplit(args.upstream)
    rng = random.Random(args.seed)
    lock = threading.Lock()
    stats = {"requests": 0, "failed": 0, "dropped": 0, "lost": 0, "forwarded": 0, "held": 0}
    stats["bytes_down"] = 0  # response bodies passed to the client

    def count(key: str, n: int = 1) -> None:
        with lock:
            stats[key] += n
            with open(args.stats + ".tmp", "w") as fh:
                json.dump(stats, fh)
            os.replace(args.stats + ".tmp", args.stats)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().strip().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        break
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                return b"".join(parts)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            body = self._body()
            with lock:
                stats["requests"] += 1
                roll = rng.random()
            outage = _outage(args.stats + ".outage")
            if outage == "hang":
                count("held")
                while _outage(args.stats + ".outage") == "hang":
                    time.sleep(0.05)  # a poll: the test removes the outage file
                self.close_connection = True
                return
            if roll < args.fail or outage is not None:
                count("failed")
                msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Length", str(len(msg)))
                self.send_header("Content-Type", "application/xml")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(msg)
                return
            if roll < args.fail + args.drop:
                count("dropped")
                self.close_connection = True
                return
            conn = http.client.HTTPConnection(up.hostname, up.port, timeout=120)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            if roll < args.fail + args.drop + args.lost:
                count("lost")
                self.close_connection = True
                return
            count("forwarded")
            self.send_response(resp.status, resp.reason)
            head = self.command == "HEAD"
            for k, v in resp.getheaders():
                if k.lower() not in _HOP and (head or k.lower() != "content-length"):
                    self.send_header(k, v)
            if not head:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
                count("bytes_down", len(data))

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
