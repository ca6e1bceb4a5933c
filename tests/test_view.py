"""spotbook report and spotbook ui: the report of a resumed run checked against
``status --json``, and the dashboard driven in headless Chromium (Debian's, through
Playwright) over a store holding a finished, a failed, a preempted-and-resumed and a
running run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from .conftest import Place, cells_committed, cli, kill, on, start_cli, wait_for, write_notebook


def _gate(path: Path) -> str:
    """A cell that waits for the test to create ``path`` (the test's event, not a timer)."""
    return f"import os, time\nwhile not os.path.exists({str(path)!r}):\n    time.sleep(0.02)"


class _Elements(HTMLParser):
    """Every start tag with its attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [
            a
            for t, a in self.tags
            if t == tag and (cls is None or cls in a.get("class", "").split())
        ]


def elements(html: str) -> _Elements:
    p = _Elements()
    p.feed(html)
    return p


def status_json(run: str, cwd: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    r = cli("status", run, "--json", cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of run stores: finished, failed, and preempted (SIGKILL) then resumed."""
    base = tmp_path_factory.mktemp("view")
    runs = base / "runs"
    runs.mkdir()
    write_notebook(base / "fine.ipynb", "x = 21", "print('the answer', x * 2)")
    r = cli("run", "fine.ipynb", "fine-out.ipynb", "--run-dir", "runs/finished", cwd=base)
    assert r.returncode == 0, r.stderr
    write_notebook(base / "bad.ipynb", "y = 1", "raise ValueError('no good ' + str(y))", "z = 2")
    r = cli("run", "bad.ipynb", "bad-out.ipynb", "--run-dir", "runs/failed", cwd=base)
    assert r.returncode == 1, r.stderr
    gate = base / "go"
    write_notebook(
        base / "long.ipynb",
        "import numpy as np\nstate = np.arange(1000)\nprint('first', state.sum())",
        "more = state * 2\nprint('second', more.sum())",
        _gate(gate) + "\nprint('through the gate')",
        "print('after', more[-1])",
    )
    proc = start_cli(
        "run", "long.ipynb", "long-out.ipynb", "--run-dir", "runs/resumed",
        "--snapshot", "every-cell", cwd=base,
    )  # fmt: skip
    wait_for(lambda: cells_committed(runs / "resumed") >= 2, what="two cells committed")
    kill(proc)  # SIGKILL inside the gate cell: the node went away
    gate.touch()
    r = cli("resume", "runs/resumed", cwd=base)
    assert r.returncode == 0, r.stderr
    write_notebook(base / "point.ipynb", "print('point', k * 10)")
    r = cli(
        "sweep", "point.ipynb", "--run-dir", "runs/sweep", "-p", "k", "1,2", "--parallel", "2",
        cwd=base,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return base


def test_report_of_a_resumed_run_matches_status(stores: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    r = cli("report", str(stores / "runs" / "resumed"), "-o", str(out), cwd=stores)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    doc = status_json(str(stores / "runs" / "resumed"), stores)
    assert doc["preemptions"] == 1 and len(doc["attempts"]) == 2
    page = elements(html)
    (summary,) = page.find("section", "summary")
    assert summary["data-status"] == doc["status"] == "succeeded"
    assert int(summary["data-cells-done"]) == doc["cells_done"] == 4
    assert int(summary["data-attempts"]) == len(doc["attempts"])
    assert int(summary["data-preemptions"]) == doc["preemptions"]
    # one bar per attempt, from its process's start
    bars = page.find("rect", "attempt")
    assert [int(b["data-attempt"]) for b in bars] == [a["attempt"] for a in doc["attempts"]]
    for bar, a in zip(bars, doc["attempts"], strict=True):
        assert float(bar["data-start"]) == pytest.approx(a["process_started"], abs=1e-3)
        assert bar["data-outcome"] == a["outcome"]
    assert float(bars[1]["data-end"]) == pytest.approx(doc["attempts"][1]["ended"], abs=1e-3)
    # the gap where the downtime report puts it, split as it splits it
    (event,) = doc["downtime"]["preemptions"]
    (gap,) = page.find("g", "gap")
    assert float(gap["data-start"]) == pytest.approx(event["last_progress_at"], abs=1e-3)
    assert float(gap["data-end"]) == pytest.approx(event["running_new_cells_at"], abs=1e-3)
    splits = {a["class"].split()[1]: float(a["data-seconds"]) for a in page.find("rect", "split")}
    for key, seconds in event["split"].items():
        if seconds > 0:
            assert splits[key.replace("_", "-")] == pytest.approx(seconds, abs=1e-3)
    assert float(bars[0]["data-end"]) == pytest.approx(event["last_progress_at"], abs=1e-3)
    # the summary's downtime split is the report's totals
    for span in page.find("span", "split"):
        assert float(span["data-seconds"]) == pytest.approx(event["split"][span["data-key"]])
    # the notebook, rendered: every cell's output, and the resume's fidelity report
    for text in ("first 499500", "second 999000", "through the gate", "after 1998"):
        assert text in html
    assert "nothing known to differ from an uninterrupted run" in html
    # loads nothing: a CSP that forbids it, and no reference out of the file
    (csp,) = [m for m in page.find("meta") if m.get("http-equiv") == "Content-Security-Policy"]
    assert csp["content"].startswith("default-src 'none';") and "script-src" not in csp["content"]
    assert "form-action 'none'" in csp["content"] and "base-uri 'none'" in csp["content"]
    refs = [v for _, attrs in page.tags for k, v in attrs.items() if k in ("src", "href", "action")]
    assert all(not re.match(r"^[a-z]+:", v) or v.startswith("data:") for v in refs), refs
    assert "<script" not in html


def test_report_of_a_failed_run_and_errors(stores: Path, tmp_path: Path) -> None:
    out = tmp_path / "failed.html"
    r = cli("report", str(stores / "runs" / "failed"), "-o", str(out), cwd=stores)
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert 'data-status="failed"' in html
    assert "ValueError: no good 1" in html
    # a run that is not there: exit 2 and what to do
    r = cli("report", str(stores / "nowhere"), "-o", str(out), cwd=stores)
    assert r.returncode == 2 and "spotbook runs" in r.stderr, r.stderr
    # a place the report cannot be written: exit 2, the reason
    r = cli("report", str(stores / "runs" / "failed"), "-o", "/proc/nope/r.html", cwd=stores)
    assert r.returncode == 2 and "cannot write /proc/nope/r.html" in r.stderr, r.stderr


@on("s3")
def test_report_and_listing_of_a_run_in_a_bucket(place: Place, work: Path) -> None:
    from spotbook import find_runs, run_notebook

    write_notebook(work / "b.ipynb", "v = 7", "print('from the bucket', v)")
    r = cli("run", "b.ipynb", "b-out.ipynb", "--run-dir", place.rd, cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    out = work / "b.html"
    r = cli("report", place.rd, "-o", str(out), cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    assert "from the bucket 7" in out.read_text()
    listing = find_runs(place.url.rsplit("/", 1)[0])
    assert [d["run_dir"] for d in listing.runs] == [place.url] and not listing.errors
    assert "from the bucket 7" in str(run_notebook(place.url).cells[1].outputs)


# -- the dashboard -------------------------------------------------------------------


TOKEN = "s3cret-token-of-24-chars"


def test_dashboard_guards(stores: Path) -> None:
    """Loopback by default; elsewhere only with --allow-remote and a token; a run is
    named by the key a listing gave, never by a URL."""
    from spotbook.view.dashboard import Sources, create_app

    app = create_app(Sources(stores=[str(stores / "runs")], local=False), token=TOKEN)
    app.config["loopback_only"] = True
    c = app.test_client()
    assert c.get("/", base_url="http://127.0.0.1:9").status_code == 403  # no token
    r = c.get(f"/?token={TOKEN}", base_url="http://127.0.0.1:9")
    assert r.status_code == 200 and "spotbook_token" in r.headers["Set-Cookie"]
    assert c.get("/api/runs", base_url="http://127.0.0.1:9").status_code == 200  # the cookie
    # DNS rebinding: a page elsewhere that resolved its name to 127.0.0.1
    c2 = app.test_client()
    assert c2.get(f"/?token={TOKEN}", base_url="http://evil.example:9").status_code == 403
    assert c.get("/run/0123456789abcdef", base_url="http://127.0.0.1:9").status_code == 404
    assert c.get("/run/..%2F..%2Fetc", base_url="http://127.0.0.1:9").status_code == 404
    r = cli("ui", "--host", "0.0.0.0", "--port", "0", cwd=stores)
    assert r.returncode == 2 and "--allow-remote" in r.stderr, r.stderr
    # every loopback address is loopback (ui --host 127.0.0.2 once refused every request)
    assert c.get(f"/api/runs?token={TOKEN}", base_url="http://127.0.0.2:9").status_code == 200
    # an action is a POST from the dashboard's own page: a form or a script elsewhere
    # (no header, or another Origin) is refused before anything is looked up
    listing = c.get("/api/runs", base_url="http://127.0.0.1:9").get_json()
    key = listing[0]["runs"][0]["key"]
    for headers in ({}, {"X-Spotbook-Action": "1", "Origin": "http://evil.example"}):
        r = c.post(f"/run/{key}/delete", base_url="http://127.0.0.1:9", headers=headers)
        assert r.status_code == 403, headers
    assert c.post(
        f"/run/{key}/explode", base_url="http://127.0.0.1:9", headers={"X-Spotbook-Action": "1"}
    ).get_json() == {"error": "no action 'explode': stop, resume or delete"}
    assert len(list((stores / "runs").iterdir())) >= 4  # nothing deleted


def test_the_token_is_long_and_never_in_the_request_log(stores: Path) -> None:
    """A one-letter token was accepted; the first visit's URL, token and all, went to the
    request log (a terminal's scrollback, a pod's logs)."""
    r = cli("ui", "--token", "x", "--port", "0", cwd=stores)
    assert r.returncode == 2 and "has 1 characters; give one of at least 22" in r.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotbook", "ui", "--store", str(stores / "runs"), "--no-local",
         "--port", "0", "--token", TOKEN],
        cwd=stores, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()
    found = re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line)
    assert found, line
    try:
        with urllib.request.urlopen(found.group(0), timeout=60) as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "GET /?token=(hidden)" in err, err
    assert TOKEN not in err, err


@pytest.fixture
def dashboard(stores: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotbook", "ui", "--store", str(stores / "runs"), "--no-local",
         "--port", "0", "--refresh", "0.3"],
        cwd=stores, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the server says where it listens once it does
    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
    assert found, line
    try:
        yield found.group(0), proc
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_dashboard_in_chromium(
    stores: Path, dashboard: tuple[str, subprocess.Popen[str]], browser: Any, tmp_path: Path
) -> None:
    url, _ = dashboard
    runs = stores / "runs"
    gates = [stores / f"gate{i}" for i in range(3)]
    write_notebook(
        stores / "live.ipynb",
        "print('warming up')",
        *(_gate(g) + f"\nprint('passed gate {i}')" for i, g in enumerate(gates)),
    )
    live = start_cli("run", "live.ipynb", "live-out.ipynb", "--run-dir", "runs/running", cwd=stores)
    try:
        wait_for(lambda: cells_committed(runs / "running") >= 1, what="the first cell")
        ctx = browser.new_context(viewport={"width": 1200, "height": 1000})
        requests: list[str] = []
        ctx.on("request", lambda req: requests.append(req.url))
        page = ctx.new_page()
        page.goto(url)
        rows = page.locator("tr.run")
        assert rows.count() == 4
        statuses = {
            rows.nth(i).get_attribute("data-run-id"): rows.nth(i).get_attribute("data-status")
            for i in range(4)
        }
        docs = {
            name: status_json(str(runs / name), stores)
            for name in ("finished", "failed", "resumed", "running")
        }
        assert {statuses[d["run_id"]] for d in docs.values()} == {
            "succeeded",
            "failed",
            "running",
        }
        for name, d in docs.items():
            assert statuses[d["run_id"]] == d["status"], name
        page.screenshot(path=str(tmp_path / "runs.png"), full_page=True)

        # the sweep: its points, each a run page
        assert "2 succeeded" in page.inner_text("tr.sweep")
        page.click("tr.sweep a")
        points = page.locator("tr.point")
        assert points.count() == 2
        assert [points.nth(i).get_attribute("data-status") for i in range(2)] == ["succeeded"] * 2
        page.click("tr.point >> nth=1 >> a")
        page.frame_locator("#notebook-frame").locator(
            ".output_subarea", has_text="point 20"
        ).wait_for()
        page.goto(url)

        # the preempted and resumed run: one bar per attempt, the gap where the data says
        page.click(f"tr.run[data-run-id='{docs['resumed']['run_id']}'] a")
        page.wait_for_selector("svg.timeline")
        doc = docs["resumed"]
        bars = page.locator("svg.timeline rect.attempt")
        assert bars.count() == len(doc["attempts"]) == 2
        (event,) = doc["downtime"]["preemptions"]
        gap = page.locator("svg.timeline g.gap")
        assert gap.count() == 1
        assert float(gap.get_attribute("data-start")) == pytest.approx(
            event["last_progress_at"], abs=1e-3
        )
        assert float(gap.get_attribute("data-end")) == pytest.approx(
            event["running_new_cells_at"], abs=1e-3
        )
        # drawn where the data says: the gap starts where the killed attempt's bar ends
        # (both measured in one go: the live part, time line included, is swapped for a
        # new one every refresh, and a box asked of a swapped-out element is none)
        bar_x, bar_w, gap_x = page.evaluate(
            """() => {
              const b = document.querySelector('svg.timeline rect.attempt').getBoundingClientRect();
              const g = document.querySelector('svg.timeline g.gap rect').getBoundingClientRect();
              return [b.x, b.width, g.x];
            }"""
        )
        assert gap_x == pytest.approx(bar_x + bar_w, abs=1.5)
        assert "nothing known to differ" in page.inner_text("#fidelity")
        frame = page.frame_locator("#notebook-frame")
        frame.locator(".output_subarea", has_text="through the gate").wait_for()
        page.screenshot(path=str(tmp_path / "resumed.png"), full_page=True)

        # the failed run: the failing cell named, its traceback in the notebook
        page.goto(url)
        page.click(f"tr.run[data-run-id='{docs['failed']['run_id']}'] a")
        assert "ValueError: no good 1" in page.inner_text("#summary")
        page.frame_locator("#notebook-frame").locator(
            ".output_error", has_text="no good 1"
        ).wait_for()

        # the running run: the cell count advances as the notebook passes its gates
        page.goto(url)
        page.click(f"tr.run[data-run-id='{docs['running']['run_id']}'] a")
        page.wait_for_selector("#cells")
        assert page.inner_text("#cells") == "1/4"
        assert page.inner_text("#current-cell") == "1"
        for i, g in enumerate(gates):
            g.touch()
            page.wait_for_function(
                "want => document.querySelector('#cells').textContent === want",
                arg=f"{i + 2}/4",
                timeout=60_000,
            )
        page.wait_for_function(
            "() => document.querySelector('#status').textContent === 'succeeded'",
            timeout=60_000,
        )
        page.frame_locator("#notebook-frame").locator(
            ".output_subarea", has_text="passed gate 2"
        ).wait_for()
        assert "passed gate 2" in page.inner_text("#logs")
        page.screenshot(path=str(tmp_path / "running.png"), full_page=True)

        # nothing outside the dashboard was asked for
        assert requests and all(r.startswith(url) for r in requests), [
            r for r in requests if not r.startswith(url)
        ]
        # the report file, opened in the browser, asks for nothing but itself
        report = tmp_path / "resumed.html"
        r = cli("report", str(runs / "resumed"), "-o", str(report), cwd=stores)
        assert r.returncode == 0, r.stderr
        seen: list[str] = []
        p2 = ctx.new_page()
        p2.on("request", lambda req: seen.append(req.url))
        p2.goto(report.as_uri())
        assert p2.locator("svg.timeline rect.attempt").count() == 2
        assert seen == [report.as_uri()]
        p2.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        live.communicate(timeout=60)
        assert live.returncode == 0
    finally:
        for g in gates:
            g.touch()
        if live.poll() is None:
            kill(live)


def test_dashboard_acts_on_a_run_in_a_narrow_window(
    stores: Path, dashboard: tuple[str, subprocess.Popen[str]], browser: Any, tmp_path: Path
) -> None:
    """At 700 px wide, as a user drives it: the listing shows start, time taken and
    parameters; on the run's page Stop stops the running run (the user's stop), Resume
    continues it to the end, the .ipynb downloads, and Delete removes it."""
    url, _ = dashboard
    gate, started = stores / "act-gate", stores / "act-started"
    write_notebook(
        stores / "act.ipynb",
        "print('before', n)",  # n: the injected parameter
        f"import os, time\nopen({str(started)!r}, 'w').close()\n" + _gate(gate),
        "print('after', n * 2)",
    )
    proc = start_cli("run", "act.ipynb", "--run-dir", "runs/act", "-p", "n", "4", cwd=stores)
    try:
        wait_for(started.exists, timeout=120, what="the gated cell")
        run_id = json.loads((stores / "runs/act/run.json").read_text())["spec"]["run_id"]
        ctx = browser.new_context(viewport={"width": 700, "height": 900})
        requests: list[str] = []
        ctx.on("request", lambda req: requests.append(req.url))
        page = ctx.new_page()
        page.goto(url)
        row = page.locator(f"tr.run[data-run-id='{run_id}']")
        assert row.locator("td.parameters").inner_text() == "n=4"
        assert row.locator("td.started").inner_text() != "-"
        assert page.evaluate("document.documentElement.scrollWidth") <= 700  # no sideways
        row.locator("a").click()
        page.wait_for_selector("#stop")
        assert page.evaluate("document.documentElement.scrollWidth") <= 700
        page.screenshot(path=str(tmp_path / "act-running.png"), full_page=True)

        page.click("#stop")
        page.wait_for_function(
            "() => /as Ctrl-C would/.test(document.querySelector('#said').textContent)"
        )
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 75, err  # stopped, resumable
        page.wait_for_function(
            "() => document.querySelector('#status').textContent === 'interrupted'",
            timeout=60_000,
        )
        gate.touch()
        page.click("#resume")
        page.wait_for_function(
            "() => document.querySelector('#status').textContent === 'succeeded'",
            timeout=120_000,
        )
        doc = status_json(str(stores / "runs/act"), stores)
        assert [a["outcome"] for a in doc["attempts"]] == ["stopped", "completed"]
        assert doc["preemptions"] == 0

        with page.expect_download() as got:
            page.click("#download")
        nb = json.loads(Path(got.value.path()).read_text())
        assert "after 8" in json.dumps(nb["cells"][-1]["outputs"])

        page.on("dialog", lambda d: d.accept())
        page.click("#delete")
        page.wait_for_url(url.rstrip("/") + "/")
        assert page.locator(f"tr.run[data-run-id='{run_id}']").count() == 0
        assert not (stores / "runs" / "act").exists()
        assert requests and all(r.startswith(url) for r in requests), requests
    finally:
        gate.touch()
        if proc.poll() is None:
            kill(proc)
