"""A stateful fake Kubernetes API server for the client tests, run as its own process.

    python tests/fakekube.py PORT

It serves the part of the API spotbook uses: Jobs (create, get, list, watch, delete)
and Pods (list, get, log with follow, eviction), with label and field selectors,
resource versions and watch expiry (410 Gone). The test plays the Job controller and the
kubelet through ``/_fake/*`` endpoints: it puts pods, changes statuses, appends log
lines, injects errors for the next matching requests, and expires watches.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

LOCK = threading.Condition()
STATE: dict[str, Any] = {
    "rv": 100,
    "compacted": 0,
    "generation": 0,  # bumped by /_fake/expire: open watches end
    "objects": {},  # "kind/ns/name" -> object
    "events": [],  # (rv, kind, type, object)
    "logs": {},  # "ns/pod" -> [line]
    "faults": [],  # {"method","path","status","times","message"}
    "requests": [],  # "METHOD path?query"
    "evictions": [],  # "ns/pod"
    "gone": 0,  # watches answered 410 Gone
    "dry_runs": [],  # objects a create with dryRun=All validated and did not keep
    "namespaces": {"default", "ml"},
}
TERMINAL = ("Succeeded", "Failed")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _bump(kind: str, typ: str, obj: dict[str, Any]) -> None:
    STATE["rv"] += 1
    obj["metadata"]["resourceVersion"] = str(STATE["rv"])
    STATE["events"].append((STATE["rv"], kind, typ, json.loads(json.dumps(obj))))
    LOCK.notify_all()


def _labels_match(obj: dict[str, Any], selector: str) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value.lstrip("="):
            return False
    return True


def _fields_match(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value.lstrip("="):
            return False
        if key == "metadata.namespace" and obj["metadata"]["namespace"] != value.lstrip("="):
            return False
    return True


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _parse(path: str) -> tuple[str | None, str | None, str | None, str | None]:
    """(kind, namespace, name, subresource) of an API path."""
    parts = [p for p in path.split("/") if p]
    if parts[:3] == ["apis", "batch", "v1"]:
        rest = parts[3:]
    elif parts[:2] == ["api", "v1"]:
        rest = parts[2:]
    else:
        return None, None, None, None
    ns = None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    kind = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return kind, ns, name, sub


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    raw_body = b""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ------------------------------------------------------------------
    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _start_stream(self, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _body(self) -> Any:
        return json.loads(self.raw_body or b"null")

    def _fault(self, path: str) -> bool:
        with LOCK:
            for f in STATE["faults"]:
                if f["times"] > 0 and f["method"] == self.command and f["path"] in path:
                    f["times"] -= 1
                    code = f["status"]
                    msg = f.get("message", "injected")
                    break
            else:
                return False
        if f.get("html"):  # a proxy's error page, not a Kubernetes Status
            data = f"<html><body><h1>{code}</h1>{msg}</body></html>".encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return True
        self._send(code, _status(code, f.get("reason", "Injected"), msg))
        return True

    def _route(self) -> None:
        # read every request's body, whatever the answer: an unread one would be taken
        # for the start of the next request on the kept-alive connection
        self.raw_body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        with LOCK:
            STATE["requests"].append(f"{self.command} {self.path}")
        if url.path.startswith("/_fake/"):
            return self._control(url.path[len("/_fake/") :], query)
        if self._fault(url.path):
            return None
        if url.path == "/version":
            return self._send(200, {"major": "1", "minor": "37", "gitVersion": "v1.37.0"})
        kind, ns, name, sub = _parse(url.path)
        if kind not in ("jobs", "pods", "nodes", "secrets"):
            return self._send(
                404, _status(404, "NotFound", f"the server could not find {url.path}")
            )
        if ns is not None and ns not in STATE["namespaces"]:
            return self._send(404, _status(404, "NotFound", f'namespaces "{ns}" not found'))
        if self.command == "GET" and name is None:
            if query.get("watch") in ("true", "1"):
                return self._watch(kind, ns, query)
            return self._list(kind, ns, query)
        if self.command == "POST" and name is None:
            return self._create(kind, ns, self._body(), query.get("dryRun") == "All")
        key = f"{kind}/{ns}/{name}"
        if self.command == "POST" and sub == "eviction":
            return self._evict(key, ns, name)
        with LOCK:
            obj = STATE["objects"].get(key)
        if obj is None:
            return self._send(404, _status(404, "NotFound", f'{kind} "{name}" not found'))
        if self.command == "GET" and sub == "log":
            return self._log(key, ns, name, query)
        if self.command == "GET":
            return self._send(200, obj)
        if self.command == "DELETE":
            return self._delete(kind, key, obj)
        return self._send(405, _status(405, "MethodNotAllowed", self.command))

    do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _route

    # -- API -------------------------------------------------------------------------
    def _list(self, kind: str, ns: str | None, query: dict[str, str]) -> None:
        with LOCK:
            items = [
                o
                for k, o in STATE["objects"].items()
                if k.startswith(f"{kind}/")
                and (ns is None or o["metadata"]["namespace"] == ns)
                and _labels_match(o, query.get("labelSelector", ""))
                and _fields_match(o, query.get("fieldSelector", ""))
            ]
            rv = str(STATE["rv"])
        api = "batch/v1" if kind == "jobs" else "v1"
        list_kind = "JobList" if kind == "jobs" else "PodList"
        self._send(
            200,
            {
                "apiVersion": api,
                "kind": list_kind,
                "metadata": {"resourceVersion": rv},
                "items": items,
            },
        )

    def _watch(self, kind: str, ns: str | None, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 30)
        self._start_stream("application/json")
        with LOCK:
            generation = STATE["generation"]
            if since and since < STATE["compacted"]:
                STATE["gone"] += 1
                gone = _status(410, "Expired", f"too old resource version: {since}")
                self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                self._end_stream()
                return
            if not since:
                since = STATE["rv"]
        try:
            while time.monotonic() < deadline:
                with LOCK:
                    pending = [
                        e
                        for e in STATE["events"]
                        if e[0] > since
                        and e[1] == kind
                        and (ns is None or e[3]["metadata"]["namespace"] == ns)
                        and _labels_match(e[3], query.get("labelSelector", ""))
                        and _fields_match(e[3], query.get("fieldSelector", ""))
                    ]
                    if not pending:
                        if STATE["generation"] != generation:
                            break
                        LOCK.wait(timeout=0.2)
                        since = max(since, 0)
                        continue
                for rv, _, typ, obj in pending:
                    self._chunk(json.dumps({"type": typ, "object": obj}).encode() + b"\n")
                    since = rv
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _create(self, kind: str, ns: str | None, obj: dict[str, Any], dry_run: bool) -> None:
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = ns
        key = f"{kind}/{ns}/{meta.get('name')}"
        with LOCK:
            if key in STATE["objects"]:
                return self._send(
                    409,
                    _status(409, "AlreadyExists", f'{kind} "{meta.get("name")}" already exists'),
                )
            if dry_run:  # validated and admitted, as a real server does; nothing kept
                STATE["dry_runs"].append(key)
                return self._send(201, obj)
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now())
            obj.setdefault("status", {})
            STATE["objects"][key] = obj
            _bump(kind, "ADDED", obj)
        return self._send(201, obj)

    def _delete(self, kind: str, key: str, obj: dict[str, Any]) -> None:
        with LOCK:
            del STATE["objects"][key]
            _bump(kind, "DELETED", obj)
            if kind == "jobs":  # background propagation: the Job's pods go too
                run = (obj["metadata"].get("labels") or {}).get("spotbook.dev/run-id")
                for k in [k for k in STATE["objects"] if k.startswith("pods/")]:
                    pod = STATE["objects"][k]
                    if (pod["metadata"].get("labels") or {}).get("spotbook.dev/run-id") == run:
                        del STATE["objects"][k]
                        _bump("pods", "DELETED", pod)
        self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}})

    def _evict(self, key: str, ns: str | None, name: str | None) -> None:
        with LOCK:
            if key not in STATE["objects"]:
                return self._send(404, _status(404, "NotFound", f'pods "{name}" not found'))
            STATE["evictions"].append(f"{ns}/{name}")
        body = {"kind": "Status", "apiVersion": "v1", "status": "Success", "metadata": {}}
        return self._send(201, body)

    def _log(self, key: str, ns: str | None, name: str | None, query: dict[str, str]) -> None:
        lkey = f"{ns}/{name}"
        with LOCK:
            pod = STATE["objects"][key]
            if pod.get("status", {}).get("phase", "Pending") == "Pending":
                msg = f'container "notebook" in pod "{name}" is waiting to start'
                return self._send(400, _status(400, "BadRequest", msg))
        follow = query.get("follow") in ("true", "1")
        self._start_stream("text/plain")
        sent = 0
        try:
            while True:
                with LOCK:
                    lines = STATE["logs"].get(lkey, [])
                    new, sent = lines[sent:], len(lines)
                    pod = STATE["objects"].get(key)
                    done = pod is None or pod["status"].get("phase") in TERMINAL
                for line in new:
                    self._chunk((line + "\n").encode())
                if not follow or (done and not new):
                    break
                with LOCK:
                    LOCK.wait(timeout=0.2)
            self._end_stream()
        except (BrokenPipeError, ConnectionResetError):
            pass

    # -- the test's side ------------------------------------------------------------------
    def _control(self, what: str, query: dict[str, str]) -> None:
        body = self._body() if self.command == "POST" else None
        with LOCK:
            if what == "put":
                kind, obj = body["kind"], body["object"]
                meta = obj["metadata"]
                if kind != "nodes":  # nodes belong to no namespace
                    meta.setdefault("namespace", "default")
                key = f"{kind}/{meta.get('namespace')}/{meta['name']}"
                old = STATE["objects"].get(key)
                if old is None:
                    meta.setdefault("uid", str(uuid.uuid4()))
                    meta.setdefault("creationTimestamp", _now())
                STATE["objects"][key] = obj
                _bump(kind, "MODIFIED" if old else "ADDED", obj)
                out: Any = obj
            elif what == "status":
                key = f"{body['kind']}/{body['namespace']}/{body['name']}"
                obj = STATE["objects"][key]
                obj["status"] = body["status"]
                _bump(body["kind"], "MODIFIED", obj)
                out = obj
            elif what == "log":
                STATE["logs"].setdefault(f"{body['namespace']}/{body['pod']}", []).extend(
                    body["lines"]
                )
                LOCK.notify_all()
                out = {}
            elif what == "fault":
                STATE["faults"].append(body)
                out = {}
            elif what == "expire":
                STATE["compacted"] = STATE["rv"] + 1
                STATE["generation"] += 1
                LOCK.notify_all()
                out = {}
            elif what == "state":
                out = {
                    "objects": STATE["objects"],
                    "requests": STATE["requests"],
                    "evictions": STATE["evictions"],
                    "gone": STATE["gone"],
                    "dry_runs": STATE["dry_runs"],
                }
            else:
                out = None
        if out is None:
            return self._send(404, {"error": what})
        return self._send(200, out)


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
