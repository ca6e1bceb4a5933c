"""Shared helpers: the CLI as a real subprocess, notebooks on disk, store probes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from .nbwrite import write_notebook as write_notebook  # the tests import it from here
from .servers import FakeKube, Storage, start_azure, start_gcs, start_s3

HERE = Path(__file__).parent
NOTEBOOKS = HERE / "notebooks"
SHARED = HERE.parent.parent / "shared" / "notebooks"


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180):
    """Run ``spotbook ARGS`` as a subprocess; return the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "spotbook", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,  # a pipe on stdin would be the notebook (papermill's rule)
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "spotbook", *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


# How much longer than a test's own bound a wait may last before it counts as a hang
# (SPOTBOOK_TEST_HANG_FACTOR): a slow machine must not fail a test that a fast one passes.
HANG_FACTOR = float(os.environ.get("SPOTBOOK_TEST_HANG_FACTOR", "3"))


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 60.0,
    what: str = "",
    proc: subprocess.Popen[str] | None = None,
) -> Any:
    """Poll a real process's observable effect until it holds. Where it never does and
    ``proc`` is the process that should have caused it, that process is killed (it must
    not outlive the test) and the end of what it wrote to stderr is the failure's text.
    ``timeout`` only bounds a hang: it is stretched by HANG_FACTOR, so that a machine
    under load (issue 38's runs halve the suite's speed) is never taken for a hung one."""
    deadline = time.monotonic() + timeout * HANG_FACTOR
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            break  # it ended: the effect will not come
        time.sleep(0.02)  # a poll: the predicate is the event; its period decides nothing
    told = ""
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
        told = f"; the process (exit {proc.returncode}) wrote:\n{(err or '')[-4000:]}"
    raise AssertionError(
        f"timed out after {timeout * HANG_FACTOR:.0f} s waiting for {what or predicate}{told}"
    )


def wait_clock_past(t: float) -> None:
    """Wait until the wall clock reads past ``t`` (a time.time() value): for a test whose
    records must carry timestamps apart (a clock stamped in whole seconds), never to guess
    how long the machine takes to do something."""
    wait_for(lambda: time.time() > t, timeout=max(5.0, t - time.time() + 5.0), what=f"t > {t}")


def on_created(directory: Path, pick: Callable[[str], bool], then: Callable[[], Any]) -> Any:
    """Call ``then`` the moment a file whose name ``pick`` accepts is created in
    ``directory`` (which must exist), told by Linux's inotify as it happens, so a file
    that lives a few milliseconds (a blob being written, then renamed) is not missed.
    Returns what ``then`` returned."""
    import ctypes
    import select
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        in_create = 0x100
        assert libc.inotify_add_watch(fd, str(directory).encode(), in_create) >= 0
        deadline = time.monotonic() + 300
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no file of that name was created in {directory}"
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, 65536)
            at = 0
            while at < len(data):
                _, _, _, size = struct.unpack_from("iIII", data, at)
                name = data[at + 16 : at + 16 + size].rstrip(b"\0").decode()
                at += 16 + size
                if pick(name):
                    return then()
    finally:
        os.close(fd)


def cells_committed(run_dir: Path) -> int:
    """Number of complete cell records in a local run store (all attempts)."""
    d = run_dir / "cells"
    if not d.is_dir():
        return 0
    lines = [
        line
        for n in os.listdir(d)
        if n.endswith(".jsonl")
        for line in (d / n).read_bytes().split(b"\n")[:-1]  # a torn last line is no record
    ]
    # notes of cells that wrote files ("executed", before a snapshot) are not records
    return sum(1 for line in lines if b'"status":"executed"' not in line)


def kill(proc: subprocess.Popen[str], sig: int = signal.SIGKILL) -> tuple[int, str]:
    """Send ``sig`` and wait for the process to end; one that outlives a minute fails the
    test, and is killed so that it does not outlive the test."""
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"still running 60 s after signal {sig}; its stderr:\n{err}") from exc
    return proc.returncode, err


def _processes_with(entry: bytes) -> list[int]:
    """The processes whose environment holds ``entry`` (``NAME=value``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:  # gone already, or another user's
            continue
        if entry in env:
            found.append(int(name))
    return found


def node_lost(tmpdir: str | os.PathLike[str]) -> None:
    """A preemption takes every process of the node, not only the one a test killed: the
    kernel, which outlives its killed runner for a moment, and what the kernel started
    (a `%pip install` unpacking into the node's TMPDIR failed a wipe in ci23 by deleting
    its own folder under shutil.rmtree). Every process whose TMPDIR is ``tmpdir`` is
    killed, and waited for, before the node's disk is wiped."""
    entry = f"TMPDIR={os.fspath(tmpdir)}".encode()
    for pid in _processes_with(entry):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # a killed process's environ reads empty while it is a zombie, so this ends once
    # every one of them has died
    wait_for(lambda: not _processes_with(entry), 60, "the lost node's processes to die")


def wipe_node(work: Path, env: dict[str, str]) -> None:
    """What a new pod sees: the working directory, home and temporary directory (``env``'s
    HOME and TMPDIR) empty, the node's processes gone (the local run store, ``rd``, stays:
    it stands for the volume or bucket)."""
    node_lost(env["TMPDIR"])
    for entry in work.iterdir():
        if entry.name == "rd":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for var in ("HOME", "TMPDIR"):
        shutil.rmtree(env[var])
        os.makedirs(env[var])


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _joined(value: Any) -> Any:
    """nbformat may store multi-line strings as lists of lines; compare them joined."""
    return "".join(value) if isinstance(value, list) else value


def _output(o: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in o.items() if k != "metadata" or v}
    if "text" in out:
        out["text"] = _joined(out["text"])
    if "data" in out:
        out["data"] = {k: _joined(v) for k, v in out["data"].items()}
    return out


def comparable(nb: dict[str, Any]) -> list[tuple[Any, Any, Any]]:
    """What must match between two runs of a deterministic notebook."""
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            out.append((cell["cell_type"], _joined(cell["source"]), None))
            continue
        outputs: list[dict[str, Any]] = []
        for o in map(_output, cell.get("outputs", [])):
            last = outputs[-1] if outputs else {}
            if (
                o.get("output_type") == "stream"
                and last.get("output_type") == "stream"
                and last.get("name") == o.get("name")
            ):
                # raw nbclient keeps each kernel flush as its own output; a reader sees one text
                outputs[-1] = {**last, "text": last["text"] + o["text"]}
            else:
                outputs.append(o)
        out.append((_joined(cell["source"]), cell.get("execution_count"), outputs))
    return out


def note_fidelity(request: pytest.FixtureRequest, row: dict[str, Any]) -> None:
    """One row of the fidelity matrix's count, carried on the test's report (so that it
    reaches the summary from whichever pytest-xdist worker ran the test)."""
    request.node.user_properties.append(("fidelity", row))


def pytest_configure(config: pytest.Config) -> None:
    # The per-user run key goes in a directory of the test session's own, never the
    # tester's ~/.config (every subprocess inherits this).
    if "SPOTBOOK_CONFIG_DIR" not in os.environ:
        os.environ["SPOTBOOK_CONFIG_DIR"] = tempfile.mkdtemp(prefix="spotbook-config-")
    # the run stores of execute_notebook calls without run_dir: not the tester's ~/.cache
    if "SPOTBOOK_CACHE_DIR" not in os.environ:
        os.environ["SPOTBOOK_CACHE_DIR"] = tempfile.mkdtemp(prefix="spotbook-cache-")


# Test files whose tests all run on one pytest-xdist worker, and why.
ONE_WORKER = {
    "tests/test_podman.py": "the worker image is built once, and podman's store is not "
    "shared between concurrent builds of one image",
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Load balancing, each test its own unit of work, except the files of ONE_WORKER, one
    unit each. (xdist's own grouping, its xdist_group mark, renames the tests' node ids,
    which pytest 9.2's node ids no longer let it do: the tests spread over every worker.)"""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _Units(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in ONE_WORKER else nodeid

    return _Units(config, log)


@pytest.fixture(autouse=True)
def _own_index_of_runs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: Any) -> None:
    """Each test its own index of runs (the user's data directory), never the tester's
    ~/.local/share: `spotbook runs` and run ids then see only the test's own runs."""
    monkeypatch.setenv("SPOTBOOK_DATA_DIR", str(tmp_path_factory.mktemp("data")))


DURATIONS = Path(__file__).parent / "durations.json"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first, so the workers end together instead of one finishing a
    long test alone at the end (longest-first scheduling). What a test takes comes from
    tests/durations.json (scripts/test_durations.py writes it from a `--durations=0` log);
    a test it does not name counts as short. A file's tests stay together, its longest
    first, so its module-scoped fixtures are made once per worker, and files go in the
    order of their longest test. Only the order changes: every test still runs."""
    try:
        took: dict[str, float] = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    for tests in files.values():
        tests.sort(key=lambda i: -took.get(i.nodeid, 0.0))
    ordered = sorted(files.values(), key=lambda tests: -took.get(tests[0].nodeid, 0.0))
    items[:] = [item for tests in ordered for item in tests]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The fidelity matrix's count: cases (patterns x kill points) identical, named, failed;
    and the tamper suite's: attacks refused."""
    tamper = [
        r
        for key in ("passed", "failed")
        for r in terminalreporter.stats.get(key, [])
        if "test_tampered_store_is_refused" in getattr(r, "nodeid", "")
    ]
    if tamper:
        refused = sum(1 for r in tamper if r.passed)
        terminalreporter.write_line(
            f"tamper suite: {refused} of {len(tamper)} attacks refused (exit 2, object named)"
        )
    rows = [
        value
        for key in ("passed", "failed")
        for r in terminalreporter.stats.get(key, [])
        if getattr(r, "when", "") == "call"
        for name, value in getattr(r, "user_properties", [])
        if name == "fidelity"
    ]
    rows.sort(key=lambda r: r["case"])  # the workers finish in any order
    if not rows:
        return
    total = {k: sum(r[k] for r in rows) for k in ("identical", "named", "failed")}
    terminalreporter.write_line(
        f"fidelity: {len(rows)} kill points x patterns = {sum(total.values())} cases: "
        f"{total['identical']} identical, {total['named']} named, {total['failed']} failed"
    )
    for r in rows:
        terminalreporter.write_line(
            f"  {r['case']:<32} {r['identical']:>3} identical {r['named']:>3} named "
            f"{r['failed']:>3} failed"
            + (f" (named: {', '.join(r['which'])})" if r.get("which") else "")
        )


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], Any]
) -> Any:
    """``make(folder)``'s result (JSON), made once for the whole test session: the first
    pytest-xdist worker to ask makes it while the others wait on a lock (an event, not a
    guess), then every worker reads it. For what the tests only read, such as an
    uninterrupted reference run's outputs: each worker would otherwise make its own."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    done = root / f"made-once-{name}.json"
    with open(root / f"made-once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if done.exists():
            return json.loads(done.read_text())
        folder = root / f"made-once-{name}"
        shutil.rmtree(folder, ignore_errors=True)  # a worker that failed making it
        folder.mkdir()
        value = make(folder)
        done.write_text(json.dumps(value))
        return value


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A working directory with copies of the repo's test notebooks."""
    for nb in NOTEBOOKS.iterdir():
        (tmp_path / nb.name).write_bytes(nb.read_bytes())
    return tmp_path


@pytest.fixture
def state_env(work: Path) -> dict[str, str]:
    """Files tests/notebooks/state.ipynb writes: a side log and a run-once marker."""
    return {"SB_SIDE_FILE": str(work / "side.txt"), "SB_MARKER_FILE": str(work / "marker.txt")}


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """state.ipynb run once per session, uninterrupted, on a local store."""

    def make(where: Path) -> dict[str, Any]:
        (where / "state.ipynb").write_bytes((NOTEBOOKS / "state.ipynb").read_bytes())
        env = {"SB_SIDE_FILE": str(where / "side.txt"), "SB_MARKER_FILE": str(where / "m.txt")}
        r = cli("run", "state.ipynb", "ref.ipynb", "--run-dir", "ref", cwd=where, env=env)
        assert r.returncode == 0, r.stderr
        return load(where / "ref.ipynb")

    made: dict[str, Any] = made_once(tmp_path_factory, "state-reference", make)
    return made


def marker_runs(work: Path) -> int:
    """How many times state.ipynb's run-once cell ran."""
    path = work / "marker.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


# -- where run stores live: this disk, or buckets on real servers behind faulty proxies --

# Faults on the requests spotbook makes: enough that every run meets some. gcsfs
# backs off 1-2 s on its first retry (botocore ~0.1 s), so GCS gets fewer, to keep
# CI's time.
RATES = {
    "s3": {"fail": 0.06, "drop": 0.02, "lost": 0.02},
    "gs": {"fail": 0.02, "lost": 0.01},
    # none on Azurite: the Azure SDK waits 15 s before its first retry, so injected faults
    # cost minutes per test; the retry code above the SDK is the one s3 and gs exercise
    "az": {},
}
STARTERS = {"s3": start_s3, "gs": start_gcs, "az": start_azure}


class _Storages(dict[str, Storage]):
    """Servers started on first use, one per kind, for the whole session."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, kind: str) -> Storage:
        st = self[kind] = STARTERS[kind](self.tmp, RATES[kind])
        os.environ.update(st.direct_env)  # this process reads the servers directly
        return st


@pytest.fixture(scope="session")
def storages(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Storage]]:
    """moto's S3 server, fake-gcs-server and Azurite, each behind tests/faultproxy.py."""
    saved = dict(os.environ)
    started = _Storages(tmp_path_factory.mktemp("storage"))
    try:
        yield started
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for st in started.values():
            st.stop()


@dataclass
class Place:
    """A run store for one test: ``rd`` for --run-dir, ``url`` for this process."""

    kind: str  # local, s3 or gs
    rd: str
    url: str
    env: dict[str, str]  # for spotbook processes: the store's endpoint and the test's files

    def store(self) -> RunStore:
        return RunStore(self.url)

    def committed(self) -> int:
        return len(self.store().cell_records())

    def sub(self, name: str) -> Place:
        return Place(self.kind, f"{self.rd}-{name}", f"{self.url}-{name}", self.env)


@pytest.fixture(params=["local"])
def where(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
def place(
    where: str, work: Path, state_env: dict[str, str], request: pytest.FixtureRequest
) -> Place:
    if where == "local":
        return Place("local", "rd", str(work / "rd"), dict(state_env))
    st: Storage = request.getfixturevalue("storages")[where]
    rd = f"{st.bucket()}/rd"
    return Place(where, rd, rd, {**st.env, **state_env})


def on(*kinds: str) -> pytest.MarkDecorator:
    """Run a test with its run store on each of these: local, s3, gs."""
    return pytest.mark.parametrize("where", kinds, indirect=True)


@pytest.fixture
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeKube]:
    """A fresh fake Kubernetes API server (tests/fakekube.py) and a kubeconfig for it."""
    fake = FakeKube(tmp_path_factory.mktemp("kube"))
    try:
        yield fake
    finally:
        fake.stop()


CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def browser() -> Iterator[Any]:
    """Debian's Chromium, headless, driven by Playwright (never a browser of its own)."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium: scripts/check.sh installs Debian's where it runs as root")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            yield b
        finally:
            b.close()
