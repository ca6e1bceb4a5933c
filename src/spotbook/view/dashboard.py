"""``spotbook ui``: a local web app over runs and sweeps wherever they are.

Server-rendered pages (Flask, Jinja) with one small script that fetches a page's live part
again every ``refresh`` seconds. Runs are read only through the library's public calls;
a run's page names it by a key the server handed out in a listing, so a request cannot
make the server open a URL it did not find itself.

Safety: bound to 127.0.0.1 unless told otherwise; bound elsewhere it needs a token (made
here when not given) on every request, and on loopback it answers only requests whose
Host is a loopback name (so a web page elsewhere cannot reach it by DNS rebinding). A
run's notebook is served as its own document, sandboxed: its outputs' HTML can neither
run scripts nor load anything.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any

from .._errors import RunNotFoundError, SpotbookError, UsageError
from .._models import RunStatus
from ..store.runstore import JOB_RECORD, LOCAL_RUNS, RunStore, library_runs_dir
from .report import notebook_html, render_report, run_cost_or_none, stylesheet, summarize, templates
from .timeline import timeline_svg

TOKEN_COOKIE = "spotbook_token"
# 128 bits as URL-safe base64; the token made for the user has 192
MIN_TOKEN = 22
_TOKEN_IN_URL = re.compile(r"([?&]token=)[^&\s]*")
# the notebook's document: nothing runs, nothing loads but its own inline styles and images
NOTEBOOK_CSP = (
    "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'; font-src data:"
)
# the app's pages: its own script and styles, fetches to itself
PAGE_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src data:; "
    "connect-src 'self'; frame-src 'self'; base-uri 'none'; form-action 'none'"
)
SETTLED = {RunStatus.SUCCEEDED.value, RunStatus.FAILED.value, RunStatus.CANCELLED.value}


@dataclass
class Sources:
    """Where the app looks for runs."""

    stores: list[str] = field(default_factory=list)  # folders or URLs holding run stores
    local: bool = True  # ./.spotbook/runs, the library's runs folder, the index of runs
    cluster: bool = False
    context: str | None = None
    namespace: str | None = None
    all_namespaces: bool = False

    def places(self) -> list[str]:
        out = list(self.stores)
        if self.local:
            import os

            for p in (os.path.abspath(LOCAL_RUNS), library_runs_dir()):
                if p not in out:
                    out.append(p)
        return out


def key_of(url: str) -> str:
    """A short stable key for a run store's URL (used in the dashboard's links)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class Catalog:
    """What the listings found: runs and sweeps by key (thread-safe)."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources
        self._urls: dict[str, tuple[str, str]] = {}  # key -> (kind, url)
        self._lock = threading.Lock()

    def add(self, kind: str, url: str) -> str:
        key = key_of(url)
        with self._lock:
            self._urls[key] = (kind, url)
        return key

    def lookup(self, key: str, kind: str) -> str | None:
        with self._lock:
            found = self._urls.get(key)
        if found is None:
            self.listing()  # a link from an earlier listing, or a run started since
            with self._lock:
                found = self._urls.get(key)
        return found[1] if found and found[0] == kind else None

    def listing(self) -> dict[str, Any]:
        """Every place's runs and sweeps, each with its key."""
        from ..ops.runs import cluster_runs, find_runs, list_runs

        found = [find_runs(p) for p in self.sources.places()]
        if self.sources.local:  # and every other run this user started (the index)
            found.append(list_runs())
        if self.sources.cluster:
            found.append(
                cluster_runs(
                    self.sources.context, self.sources.namespace, self.sources.all_namespaces
                )
            )
        places = []
        seen: set[str] = set()
        for listing in found:
            runs = []
            for doc in listing.runs:
                if doc["run_dir"] in seen:
                    continue
                seen.add(doc["run_dir"])
                runs.append((self.add("run", doc["run_dir"]), doc))
            sweeps = [(self.add("sweep", t.url), t) for t in listing.sweeps]
            places.append(
                {"where": listing.where, "runs": runs, "sweeps": sweeps, "errors": listing.errors}
            )
        return {"places": places}


def _version(doc: dict[str, Any]) -> str:
    """Changes whenever what the run page shows of the run does."""
    return f"{doc['status']}:{doc['cells_done']}:{len(doc['attempts'])}:{doc.get('current_cell')}"


def create_app(sources: Sources, *, token: str | None = None, refresh: float = 2.0) -> Any:
    """The Flask app (``token``: required of every request when given)."""
    if token is not None and len(token) < MIN_TOKEN:
        raise UsageError(
            f"the dashboard's token has {len(token)} characters; give one of at least "
            f"{MIN_TOKEN} (or none: `spotbook ui` makes one)"
        )
    from flask import Flask, Response, abort, jsonify, make_response, request

    from ..ops.runs import run_logs, run_notebook, run_status
    from ..ops.sweep import sweep_status

    app = Flask("spotbook.view", static_folder=None)
    catalog = Catalog(sources)
    app.config["catalog"] = catalog
    env = templates()
    css = stylesheet()

    def page(name: str, **values: Any) -> str:
        return env.get_template(name).render(css=css, csp=None, refresh=refresh, **values)

    @app.before_request
    def guard() -> Any:
        host = (request.host or "").rsplit(":", 1)[0].strip("[]")
        if app.config.get("loopback_only") and not is_loopback(host):
            abort(403, "this dashboard answers only on a loopback address")
        if request.method == "POST":
            # an action: only from the dashboard's own page (a form or script elsewhere
            # cannot set this header without a CORS preflight, which is never granted)
            origin = request.headers.get("Origin")
            if request.headers.get(ACTION_HEADER) != "1" or (
                origin is not None and origin != request.host_url.rstrip("/")
            ):
                abort(403, "actions come from the dashboard's own page")
        if token is None:
            return None
        given = request.args.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
        header = request.headers.get("Authorization", "")
        if header.startswith("token "):
            given = header[6:]
        if not hmac.compare_digest(given.encode(), token.encode()):
            abort(403, "give the dashboard's token: open the URL `spotbook ui` printed")
        return None

    @app.after_request
    def headers(resp: Response) -> Response:
        resp.headers.setdefault("Content-Security-Policy", PAGE_CSP)
        resp.headers["X-Content-Type-Options"] = "nosniff"
        resp.headers["Referrer-Policy"] = "no-referrer"
        resp.headers["Cache-Control"] = "no-store"
        if token is not None and request.args.get("token"):
            resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="Strict")
        return resp

    def run_url(key: str) -> str:
        url = catalog.lookup(key, "run")
        if url is None:
            abort(404, "no such run in this dashboard's listing")
        return url

    @app.get("/")
    def index() -> str:
        return page("runs.html", title="spotbook runs", listing=catalog.listing())

    @app.get("/part/runs")
    def runs_part() -> str:
        return env.get_template("_runs.html").render(listing=catalog.listing())

    @app.get("/api/runs")
    def runs_json() -> Any:
        listing = catalog.listing()
        return jsonify(
            [
                {
                    "where": p["where"],
                    "runs": [{"key": k, **doc} for k, doc in p["runs"]],
                    "sweeps": [{"key": k, **t.counts(), "url": t.url} for k, t in p["sweeps"]],
                    "errors": p["errors"],
                }
                for p in listing["places"]
            ]
        )

    def live(key: str) -> tuple[str, dict[str, Any]]:
        url = run_url(key)
        doc = run_status(RunStore(url))
        try:
            cost = run_cost_or_none(RunStore(url))
        except SpotbookError:
            cost = None
        try:  # from the sealed records: a store sealed with another key shows why not
            logs = run_logs(RunStore(url), lines=100)
        except SpotbookError as exc:
            logs = [f"(the log cannot be shown: {exc})"]
        html = env.get_template("_live.html").render(
            s=summarize(doc, cost),
            timeline=timeline_svg(doc),
            logs=logs,
        )
        return html, dict(doc)

    @app.get("/run/<key>")
    def run_page(key: str) -> str:
        html, doc = live(key)
        return page(
            "run.html",
            title=f"spotbook run {doc['run_id']}",
            key=key,
            doc=doc,
            live=html,
            version=_version(doc),
        )

    @app.get("/run/<key>/part")
    def run_part(key: str) -> Response:
        html, doc = live(key)
        resp = make_response(html)
        resp.headers["X-Spotbook-Version"] = _version(doc)
        resp.headers["X-Spotbook-Settled"] = "1" if doc["status"] in SETTLED else "0"
        return resp

    @app.get("/api/run/<key>")
    def run_json(key: str) -> Any:
        return jsonify(run_status(RunStore(run_url(key))))

    @app.get("/run/<key>/notebook")
    def notebook(key: str) -> Response:
        url = run_url(key)
        body = notebook_html(run_notebook(RunStore(url)))
        resp = make_response(
            env.get_template("notebook.html").render(
                title="notebook", css=css, csp=None, notebook=body
            )
        )
        resp.headers["Content-Security-Policy"] = NOTEBOOK_CSP
        return resp

    @app.get("/run/<key>/report")
    def report(key: str) -> Response:
        resp = make_response(render_report(RunStore(run_url(key))))
        resp.headers["Content-Security-Policy"] = NOTEBOOK_CSP
        resp.headers["Content-Disposition"] = f'attachment; filename="report-{key}.html"'
        return resp

    @app.get("/run/<key>/download")
    def download(key: str) -> Response:
        """The run's notebook as it stands (OUTPUT's contents), as an .ipynb file."""
        import nbformat

        url = run_url(key)
        nb = run_notebook(RunStore(url))
        doc = run_status(RunStore(url))
        resp = make_response(nbformat.writes(nb))
        resp.headers["Content-Type"] = "application/x-ipynb+json"
        resp.headers["Content-Disposition"] = f'attachment; filename="{doc["run_id"]}.ipynb"'
        return resp

    @app.post("/run/<key>/<action>")
    def act(key: str, action: str) -> Any:
        """stop, resume or delete, as `spotbook cancel`, `resume` and `runs rm` do."""
        url = run_url(key)
        try:
            said = run_action(url, action)
        except SpotbookError as exc:
            return jsonify({"error": str(exc)}), 409
        return jsonify({"done": said, "next": "/" if action == "delete" else f"/run/{key}"})

    @app.get("/sweep/<key>")
    def sweep_page(key: str) -> str:
        url = catalog.lookup(key, "sweep")
        if url is None:
            abort(404, "no such sweep in this dashboard's listing")
        table = sweep_status(url)
        points = [(catalog.add("run", r.url), r) for r in table.rows]
        return page("sweep.html", title=f"spotbook sweep {url}", table=table, points=points)

    @app.get("/static/ui.js")
    def script() -> Response:
        from importlib import resources

        text = resources.files("spotbook.view").joinpath("static/ui.js").read_text()
        return Response(text, mimetype="text/javascript")

    @app.errorhandler(RunNotFoundError)
    def gone(exc: RunNotFoundError) -> tuple[str, int]:
        return str(exc), 404

    return app


ACTION_HEADER = "X-Spotbook-Action"


def run_action(url: str, action: str) -> str:
    """Do a dashboard button's action on the run at ``url``; what was done, in words.
    Raises SpotbookError (shown on the page) when it cannot be done."""
    from ..ops.runs import cancel_run, remove_run

    store = RunStore(url)
    if action == "stop":
        done = cancel_run(store, wait=0.0)  # the page follows the rest
        if done.job is not None:
            return f"deleted Job {done.job}; the pod saves its progress on its way out"
        return f"asked the runner (pid {done.pid}) to stop, as Ctrl-C would"
    if action == "resume":
        return resume_in_background(store)
    if action == "delete":
        gone = remove_run(store)
        return f"removed run {gone.run_id}"
    raise UsageError(f"no action {action!r}: stop, resume or delete")


def resume_in_background(store: RunStore) -> str:
    """Start `spotbook resume URL` as a process of its own (it outlives the dashboard),
    its output in a log file beside the dashboard's temporary files."""
    import os
    import subprocess
    import sys
    import tempfile

    from .._status import describe

    doc = describe(store)
    if store.exists(JOB_RECORD):
        raise UsageError(
            f"run {doc['run_id']} runs as a Kubernetes Job, which resumes it by itself"
        )
    if doc["status"] in (RunStatus.RUNNING.value, RunStatus.SUCCEEDED.value):
        raise UsageError(f"run {doc['run_id']} is {doc['status']}: nothing to resume")
    fd, log_path = tempfile.mkstemp(prefix=f"spotbook-resume-{doc['run_id']}-", suffix=".log")
    with os.fdopen(fd, "w") as log_file:
        subprocess.Popen(
            [sys.executable, "-m", "spotbook", "resume", store.url, "--no-progress-bar"],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            start_new_session=True,  # not stopped with the dashboard
        )
    return f"resuming run {doc['run_id']} (its output: {log_path})"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or name."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass
class Served:
    """The dashboard being served: its URL and its server."""

    url: str  # what to open (with the token, when there is one)
    server: Any  # werkzeug's server: serve_forever(), shutdown()


def serve(
    sources: Sources,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    allow_remote: bool = False,
    refresh: float = 2.0,
) -> Served:
    """Bind the dashboard (not yet serving: call ``served.server.serve_forever()``)."""
    from werkzeug.serving import WSGIRequestHandler, make_server

    class _Handler(WSGIRequestHandler):
        """The request log without the token a first visit carries in its URL."""

        def log_request(self, code: Any = "-", size: Any = "-") -> None:
            self.requestline = _TOKEN_IN_URL.sub(r"\1(hidden)", self.requestline)
            if hasattr(self, "path"):  # the request handled (werkzeug logs it by its path)
                self.path = _TOKEN_IN_URL.sub(r"\1(hidden)", self.path)
            super().log_request(code, size)

    loopback = is_loopback(host)
    if not loopback and not allow_remote:
        raise UsageError(
            f"--host {host} would let other machines reach your runs; add --allow-remote "
            "(a token is then required of every request), or leave --host out for 127.0.0.1"
        )
    if not loopback and not token:
        token = secrets.token_urlsafe(24)
    app = create_app(sources, token=token, refresh=refresh)
    app.config["loopback_only"] = loopback
    try:
        server = make_server(host, port, app, threaded=True, request_handler=_Handler)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port"
        ) from exc
    shown = "127.0.0.1" if loopback and host != "localhost" else host
    bound = server.server_port
    url = f"http://{shown if ':' not in shown else f'[{shown}]'}:{bound}/"
    if token:
        url += f"?token={token}"
    return Served(url=url, server=server)
