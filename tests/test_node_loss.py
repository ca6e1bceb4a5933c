"""Resume on a node that has never seen the run: its files and environment come back.

Each case runs the node-loss notebook (tests/node_patterns.py: 30 file and environment
patterns) on a *node* — a working directory, a home, a temporary directory and a pip
target of its own — kills it, wipes the node (every one of those emptied, the pip-installed
package gone: what a new pod sees; only the run store survives), resumes it there, and
compares every pattern with an uninterrupted run's. Under every snapshot policy, on a
local store (beside the node, as a volume is) and on S3 behind the fault proxy.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import random
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from . import node_patterns as npat
from .conftest import cli, kill, load, made_once, node_lost, start_cli, wait_for

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261129"))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pure-Python wheel (``nlpkg``) the notebook pip-installs, built here offline."""
    return npat.build_wheel(tmp_path_factory.mktemp("nlpkg"))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A file on a loopback HTTP server, for the notebook's download."""
    root = tmp_path_factory.mktemp("served")
    (root / "data.txt").write_text("downloaded bytes")
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/data.txt"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Node:
    """A machine's disk as a run sees it: what a preemption takes away."""

    root: Path
    wheel: Path
    url: str

    @property
    def work(self) -> Path:
        return self.root / "work"

    def env(self) -> dict[str, str]:
        site = self.root / "site"
        return {
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            # %pip installs here, and the kernel imports from here: the pod's environment
            "PIP_TARGET": str(site),
            "PYTHONPATH": str(site),
            "PIP_NO_INDEX": "1",
            "NL_WHEEL": str(self.wheel),
            "NL_URL": self.url,
            "NL_GATE": str(self.root.parent / f"{self.root.name}-gate"),
            # matplotlib's font cache is the image's, not the node's (it takes seconds)
            "MPLCONFIGDIR": str(self.root.parent / "mpl"),
        }

    def make(self) -> Node:
        for name in ("work", "home", "tmp", "site"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        npat.write(self.work / "nl.ipynb")
        return self

    def wipe(self) -> None:
        """What a new pod sees: all of it empty, the pip-installed package gone."""
        node_lost(self.root / "tmp")
        for name in ("work", "home", "tmp", "site"):
            shutil.rmtree(self.root / name)
        self.make()

    def release(self) -> None:
        Path(self.env()["NL_GATE"]).touch()


@pytest.fixture
def node(tmp_path: Path, wheel: Path, served: str) -> Node:
    return Node(tmp_path / "node", wheel, served).make()


@pytest.fixture(scope="module")
def nl_reference_run(
    tmp_path_factory: pytest.TempPathFactory, wheel: Path, served: str
) -> tuple[dict[str, str], float]:
    """The node-loss notebook run once, uninterrupted (once for every worker: its
    patterns name no path nor port): its patterns and its duration."""

    def make(where: Path) -> tuple[dict[str, str], float]:
        n = Node(where / "node", wheel, served).make()
        n.release()
        r = cli("run", "nl.ipynb", "ref.ipynb", "--run-dir", "../ref", cwd=n.work, env=n.env())
        assert r.returncode == 0, r.stderr
        nb = load(n.work / "ref.ipynb")
        found = npat.patterns(nb)
        assert len(found) >= 30 and "(errors)" not in found, found
        return found, float(nb["metadata"]["papermill"]["duration"])

    found, seconds = made_once(tmp_path_factory, "node-loss-reference", make)
    return found, seconds


@pytest.fixture(scope="module")
def nl_reference(nl_reference_run: tuple[dict[str, str], float]) -> dict[str, str]:
    return nl_reference_run[0]


def _store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict]:
    """The run store: beside the node (a volume that outlives it), or an S3 bucket."""
    if kind == "local":
        return str(tmp_path / "store" / "rd"), {}
    st = request.getfixturevalue("storages")["s3"]
    return f"{st.bucket()}/rd", dict(st.env)


def _attempts(rd: str, env: dict[str, str], cwd: Path) -> list[dict[str, Any]]:
    r = cli("status", rd, "--json", cwd=cwd, env=env)
    assert r.returncode == 0, r.stderr
    attempts: list[dict[str, Any]] = json.loads(r.stdout)["attempts"]
    return attempts


CASES = [(kind, mode) for kind in ("local", "s3") for mode in ("every-cell", "auto", "off")]


@pytest.mark.parametrize(("kind", "mode"), CASES)
def test_resume_on_a_wiped_node_is_identical(
    node: Node,
    nl_reference: dict[str, str],
    kind: str,
    mode: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    rd, store_env = _store(kind, tmp_path, request)
    env = {**node.env(), **store_env}
    extra = ["--snapshot-interval", "1"] if mode == "auto" else []
    proc = start_cli(
        "run", "nl.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", mode, *extra,
        cwd=node.work, env=env,
    )  # fmt: skip
    probe = RunStore(rd) if kind == "local" else None
    wait_for(
        lambda: _gate_reached(rd, probe),
        timeout=240,
        what="the run at its gate cell",
        proc=proc,
    )
    code, err = kill(proc)
    assert code == -signal.SIGKILL, err
    node.wipe()
    node.release()
    r = cli("resume", rd, cwd=node.work, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = npat.patterns(load(node.work / "out.ipynb"))
    diff = {k: (got.get(k), v) for k, v in nl_reference.items() if got.get(k) != v}
    assert not diff, (diff, got.get("(errors)"))
    last = _attempts(rd, env, node.work)[-1]
    fidelity = last["fidelity"]
    if mode == "every-cell":
        assert fidelity["exact"], fidelity["may_differ"]
    else:
        # cells after the last snapshot ran again: those that wrote or deleted files are
        # named (what they did may differ), and nothing else is
        assert all("was replayed" in line for line in fidelity["may_differ"]), fidelity
    if mode == "every-cell":
        # the snapshot after cell 8 brought the files back, and the pip cell ran first
        assert last["files_restored"]["files"] >= 25, last["files_restored"]
        assert last["environment_replayed"] == [0]
        assert last["replayed"] == []
    elif mode == "auto":
        assert last["files_restored"]["files"] > 0


def _gate_reached(rd: str, probe: RunStore | None) -> bool:
    """The records of every cell before the gate are committed (the gate cell runs).
    This process reads the store's server directly (the storages fixture set that up),
    never through the run's faulty proxy: fsspec keeps one client per set of options, so
    a client made under the proxy's endpoint would serve every later test in the worker."""
    probe = probe or RunStore(rd)
    return len(probe.cell_records()) >= npat.GATE


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_random_kills_on_new_nodes(
    node: Node,
    nl_reference_run: tuple[dict[str, str], float],
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    """Kills at random points of an every-cell run (an instant drawn from the duration
    the uninterrupted run took, a record committing, a blob being written — on the local
    store, where it can be seen), each followed by a wiped node; the run waits at its
    gate until the last kill, so every kill lands on any machine."""
    nl_reference, seconds = nl_reference_run
    rng = random.Random(f"{SEED}-node-loss-{kind}")
    rd, store_env = _store(kind, tmp_path, request)
    env = {**node.env(), **store_env}

    def store() -> RunStore:
        return RunStore(rd)  # directly, as _gate_reached reads

    proc = start_cli(
        "run", "nl.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", "every-cell",
        cwd=node.work, env=env,
    )  # fmt: skip
    kills = 6
    points = ["instant", "record", "blob"] if kind == "local" else ["instant", "record"]
    for k in range(kills):
        wait_for(lambda k=k: len(store().attempt_numbers()) > k, timeout=120, what="an attempt")
        point = rng.choice(points)
        if point == "instant":
            with contextlib.suppress(subprocess.TimeoutExpired):  # ends early only on a crash
                proc.wait(timeout=rng.uniform(0.0, seconds))
        elif point == "record":
            n = len(store().cell_records())
            wait_for(
                lambda n=n: len(store().cell_records()) > min(n, npat.GATE - 1),
                timeout=120,
                what="a record",
            )
        else:
            blobs = Path(rd) / "state" / "blobs"
            wait_for(
                lambda blobs=blobs: (
                    len(store().cell_records()) >= npat.GATE
                    or (blobs.is_dir() and any(".tmp-" in n for n in os.listdir(blobs)))
                ),
                timeout=120,
                what="a blob being written",
            )
        code, err = kill(proc)
        assert code == -signal.SIGKILL, f"the run ended before kill {k + 1}: {err}"
        node.wipe()
        proc = start_cli("resume", rd, cwd=node.work, env=env)
    node.release()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    got = npat.patterns(load(node.work / "out.ipynb"))
    diff = {k: (got.get(k), v) for k, v in nl_reference.items() if got.get(k) != v}
    assert not diff, (diff, got.get("(errors)"))
    assert len(_attempts(rd, env, node.work)) == kills + 1


def test_a_file_that_is_not_saved_is_named_and_strict_refuses(
    node: Node, nl_reference: dict[str, str], tmp_path: Path
) -> None:
    """--files-exclude leaves arr.npy out of the snapshots: on a wiped node the report
    names it (never "nothing known to differ"), and --strict-resume refuses (exit 6)."""
    rd = str(tmp_path / "store" / "rd")
    env = node.env()
    proc = start_cli(
        "run", "nl.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", "every-cell",
        "--files-exclude", "*.npy", cwd=node.work, env=env,
    )  # fmt: skip
    wait_for(lambda: len(RunStore(rd).cell_records()) >= npat.GATE, timeout=240, what="gate")
    kill(proc)
    node.wipe()
    r = cli("resume", rd, "--strict-resume", cwd=node.work, env=env)
    assert r.returncode == 6, r.stderr
    assert "arr.npy" in r.stderr and "--files-exclude *.npy" in r.stderr, r.stderr
    attempts = _attempts(rd, env, node.work)
    assert attempts[-1]["outcome"] == "resume-refused"
    text = cli("status", rd, cwd=node.work, env=env).stdout
    assert "nothing known to differ" not in text.split("#2")[-1]
    # without --strict-resume, the cell that wrote it (its record says so) is replayed
    node.release()
    r = cli("resume", rd, cwd=node.work, env=env)
    assert r.returncode == 0, r.stderr
    got = npat.patterns(load(node.work / "out.ipynb"))
    assert {k: v for k, v in nl_reference.items() if got.get(k) != v} == {}
    last = _attempts(rd, env, node.work)[-1]
    assert 1 in last["replayed"]  # the notebook's index; the words number cells as papermill
    assert any("cell 2, which wrote it, is replayed" in m for m in last["fidelity"]["may_differ"])


def test_same_node_copies_nothing(node: Node, nl_reference: dict[str, str], tmp_path: Path) -> None:
    """Resumed where its files are intact, nothing is restored, and every pattern is the
    uninterrupted run's."""
    rd = str(tmp_path / "store" / "rd")
    env = node.env()
    proc = start_cli(
        "run", "nl.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", "every-cell",
        cwd=node.work, env=env,
    )  # fmt: skip
    wait_for(lambda: len(RunStore(rd).cell_records()) >= npat.GATE, timeout=240, what="gate")
    kill(proc)
    node.release()
    r = cli("resume", rd, cwd=node.work, env=env)
    assert r.returncode == 0, r.stderr
    last = _attempts(rd, env, node.work)[-1]
    assert last["files_restored"]["files"] == 0
    assert not last.get("environment_replayed")
    got = npat.patterns(load(node.work / "out.ipynb"))
    assert {k: (got.get(k), v) for k, v in nl_reference.items() if got.get(k) != v} == {}


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_checkpoint_dir_commits_with_its_cell(
    kind: str, node: Node, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """What a cell wrote into ``spotbook.checkpoint_dir()`` is in the store before that
    cell's record commits (it used to wait for the 60 s sync), and the directory has the
    same path in every attempt (a path kept in a variable still works), also on a new
    node. A local store is kept as an object store is: the directory is never a folder in
    the store, where its writer could change it between two attempts (issue 31)."""
    rd, store_env = _store(kind, tmp_path, request)
    env = {**node.env(), **store_env}
    gate = node.env()["NL_GATE"]
    from .conftest import write_notebook

    write_notebook(
        node.work / "ck.ipynb",
        "import os, spotbook\nckpt = spotbook.checkpoint_dir()\n"
        "with open(os.path.join(ckpt, 'best.txt'), 'w') as fh:\n    fh.write('epoch 3')",
        f"import time\nwhile not os.path.exists({gate!r}):\n    time.sleep(0.01)",
        "print(open(os.path.join(ckpt, 'best.txt')).read(), ckpt == spotbook.checkpoint_dir())",
    )
    proc = start_cli(
        "run", "ck.ipynb", "out.ipynb", "--run-dir", rd, "--snapshot", "every-cell",
        cwd=node.work, env=env,
    )  # fmt: skip
    wait_for(lambda: _gate_reached_at(rd, 1), timeout=120, what="cell 0 committed")
    code, err = kill(proc)  # long before the periodic sync (60 s)
    assert code == -signal.SIGKILL, err
    node.wipe()
    node.release()
    r = cli("resume", rd, cwd=node.work, env=env)
    assert r.returncode == 0, r.stderr
    text = "".join(load(node.work / "out.ipynb")["cells"][2]["outputs"][0]["text"])
    assert text == "epoch 3 True\n"
    assert "best.txt" in json.dumps(RunStore(rd).files_manifest())  # sealed, with its hash
    if kind == "local":
        # only sealed manifests in the store's files/, no plain copy of the directory
        names = os.listdir(os.path.join(rd, "files"))
        assert names and all(n.startswith("a0") and n.endswith(".json") for n in names), names


def _gate_reached_at(rd: str, n: int) -> bool:
    return len(RunStore(rd).cell_records()) >= n
