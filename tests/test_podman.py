"""The worker image, built and preempted for real with podman (rootful, as CI runs).

The image is built from the checkout on a local Debian base (tests/container_image.py,
which scripts/check.sh starts in the background during the setup) and run against the S3
server on loopback (host network), through the fault proxy. What the kubelet does to a
pod is done to the container: `podman stop -t N` (SIGTERM, SIGKILL after N s) and
`podman kill -s KILL`; a new container then resumes the run.

podman runs here with runc and cgroupfs, and without default ulimits (this machine may not
set them): tests/containers.conf, given to podman with CONTAINERS_CONF.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotbook import __version__

from .conftest import cli, comparable, wait_for, write_notebook
from .container_image import IMAGE, build_image, podman, podman_works
from .servers import Storage

KEY_IN_POD = "/var/run/secrets/spotbook/key"

# one pytest-xdist worker runs them all (conftest.ONE_WORKER says why)
pytestmark = [pytest.mark.container, pytest.mark.slow]


@pytest.fixture(scope="session")
def image() -> dict[str, Any]:
    """The CPU worker image built from this checkout; its build time and size."""
    why = podman_works()
    if why:
        pytest.skip(f"opt-in: {why}")
    took = build_image()
    size = int(podman("image", "inspect", IMAGE, "--format", "{{.Size}}").stdout.strip())
    print(f"\ncontainer image: built in {took:.1f} s, {size / 1e6:.0f} MB")
    return {"build_seconds": took, "size": size}


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    """This machine's run key as a pod gets it: a read-only file from a Secret."""
    from spotbook.store.integrity import load_key

    load_key()  # made on first use, in the session's config dir (conftest)
    path = tmp_path / "key"
    shutil.copy(Path(os.environ["SPOTBOOK_CONFIG_DIR"]) / "key", path)
    path.chmod(0o444)
    return path


def _run_args(
    name: str, st: Storage, key: Path, *env: str, extra: tuple[str, ...] = ()
) -> list[str]:
    args = ["run", "--name", name, "--network", "host", "-v", f"{key}:{KEY_IN_POD}:ro"]
    args += ["-e", f"SPOTBOOK_SNAPSHOT_KEY_FILE={KEY_IN_POD}"]
    for k, v in {**st.env, **dict(e.split("=", 1) for e in env)}.items():
        args += ["-e", f"{k}={v}"]
    return [*args, *extra, IMAGE]


def _status(rd: str, st: Storage, work: Path) -> dict[str, Any]:
    r = cli("status", rd, "--json", cwd=work, env=st.env)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


# Cell 2 waits until its container has GO set: the first container never does, so it is
# stopped or killed there, with cells 0 and 1 committed; the next one goes on.
CELLS = (
    "import random\nrandom.seed(7)\nxs = [random.random() for _ in range(5)]",
    "total = sum(xs)\nprint(round(total, 6))",
    "import os, time\nwhile not os.environ.get('GO'):\n    time.sleep(0.05)\nprint(len(xs))",
    "print(round(total * 2, 6), random.random())",
)


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    where = tmp_path_factory.mktemp("ref")
    write_notebook(where / "nb.ipynb", *CELLS)
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=where, env={"GO": "1"})
    assert r.returncode == 0, r.stderr
    return comparable(json.loads((where / "out.ipynb").read_text()))


@pytest.fixture
def prepared(tmp_path: Path, storages: dict[str, Storage]) -> Iterator[tuple[str, Storage]]:
    st = storages["s3"]
    write_notebook(tmp_path / "nb.ipynb", *CELLS)
    rd = f"{st.bucket()}/rd"
    r = cli(
        "run",
        "nb.ipynb",
        "--run-dir",
        rd,
        "--snapshot",
        "every-cell",
        "--grace",
        "1",
        "--prepare-only",
        cwd=tmp_path,
        env=st.env,
    )
    assert r.returncode == 0, r.stderr
    yield rd, st


def _committed(rd: str) -> int:
    from spotbook.store.runstore import RunStore

    return len(RunStore(rd).cell_records())


def _output(rd: str) -> list[Any]:
    from spotbook.store.runstore import RunStore

    raw = RunStore(rd).read("output.ipynb")
    assert raw is not None
    return comparable(json.loads(raw))


def test_the_image_runs_the_worker_as_a_non_root_user(image: dict[str, Any]) -> None:
    version = podman("run", "--rm", "--entrypoint", "spotbook", IMAGE, "--version").stdout
    assert __version__ in version
    assert podman("run", "--rm", "--entrypoint", "id", IMAGE, "-u").stdout.strip() == "1000"
    entry = podman("image", "inspect", IMAGE, "--format", "{{json .Config.Entrypoint}}").stdout
    assert json.loads(entry) == ["spotbook", "worker"]


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_stopped_or_killed_container_is_resumed_by_the_next(
    image: dict[str, Any],
    prepared: tuple[str, Storage],
    key_file: Path,
    reference: list[Any],
    tmp_path: Path,
    how: str,
) -> None:
    """`podman stop -t 10`: SIGTERM, the cell's grace, progress saved, exit 75; `podman
    kill -s KILL`: no notice. Either way a new container resumes to the same notebook."""
    rd, st = prepared
    name = f"sb-{how}-{os.getpid()}"
    podman(*_run_args(name, st, key_file, f"SPOTBOOK_RUN_DIR={rd}", extra=("-d",)))

    def progressed() -> bool:
        state = podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
        assert state == "running", podman("logs", name).stderr[-2000:]
        return _committed(rd) >= 2

    try:
        wait_for(progressed, timeout=300, what="cells 0 and 1 in the store")
        if how == "stop":
            t0 = time.monotonic()
            podman("stop", "-t", "10", name, timeout=120)
            took = time.monotonic() - t0
            print(f"\npodman stop to exit: {took:.2f} s")
            code = int(podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout)
            assert code == 75, podman("logs", name).stderr[-2000:]
            assert _status(rd, st, tmp_path)["attempts"][0]["outcome"] == "preempted"
        else:
            podman("kill", "-s", "KILL", name)
            podman("wait", name, check=False)
    finally:
        podman("rm", "-f", name, check=False)
    again = f"{name}-2"
    env = (f"SPOTBOOK_RUN_DIR={rd}", "GO=1")
    r = podman(*_run_args(again, st, key_file, *env, extra=("--rm",)), check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _output(rd) == reference
    doc = _status(rd, st, tmp_path)
    assert doc["status"] == "succeeded" and doc["attempts"][1]["resumed_from"] >= 2


def test_the_classic_variables_end_to_end(
    image: dict[str, Any], storages: dict[str, Storage], key_file: Path, tmp_path: Path
) -> None:
    """BUCKET_NAME / DOWNLOAD_FILE_PATH / UPLOAD_FILE_PATH, the recipe spotbook grew from."""
    st = storages["s3"]
    bucket = st.bucket()
    write_notebook(tmp_path / "nb.ipynb", "x = 6 * 7", "print(x)")
    from spotbook.store.runstore import read_url, write_url

    write_url(f"{bucket}/in/nb.ipynb", (tmp_path / "nb.ipynb").read_bytes())
    env = (
        f"BUCKET_NAME={bucket.split('://')[1]}",
        "SPOTBOOK_STORAGE_SCHEME=s3",
        "DOWNLOAD_FILE_PATH=in/nb.ipynb",
        "UPLOAD_FILE_PATH=out/nb.ipynb",
    )
    r = podman(
        *_run_args(f"sb-classic-{os.getpid()}", st, key_file, *env, extra=("--rm",)), check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(read_url(f"{bucket}/out/nb.ipynb"))
    assert "42" in json.dumps(out["cells"][1]["outputs"])


def test_a_read_only_root_filesystem_with_a_writable_tmp(
    image: dict[str, Any], prepared: tuple[str, Storage], key_file: Path
) -> None:
    """What a restricted pod may get (readOnlyRootFilesystem, an emptyDir on /tmp)."""
    rd, st = prepared
    extra = ("--rm", "--read-only", "--tmpfs", "/tmp")
    env = (f"SPOTBOOK_RUN_DIR={rd}", "GO=1")
    r = podman(*_run_args(f"sb-ro-{os.getpid()}", st, key_file, *env, extra=extra), check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _committed(rd) == len(CELLS)


# The node-loss notebook of a pod (issue: resume on a new node): it downloads a zip from
# a loopback server and unzips it, pip-installs a wheel from a folder the test mounts
# (into a pip target outside the working directory: gone with the container), trains a
# little and keeps checkpoints, and waits at cell 4 for GO, which only the second
# container has. Every container is a new node: nothing of the first one's disk is left.
NODE_CELLS = (
    "%pip install -q --no-index --no-deps /wheels/nlpkg-0.1-py3-none-any.whl",
    "import os, json, random, zipfile, urllib.request\n"
    "urllib.request.urlretrieve(os.environ['NL_URL'], 'data.zip')\n"
    "zipfile.ZipFile('data.zip').extractall('data')\n"
    "rows = [tuple(map(float, line.split(','))) for line in open('data/train.csv')]",
    "import nlpkg\nrandom.seed(nlpkg.VALUE)\nw, b = random.random(), 0.0\n"
    "os.makedirs('ckpt', exist_ok=True)\n"
    "for epoch in range(3):\n"
    "    for x, y in rows:\n"
    "        err = w * x + b - y\n        w -= 0.01 * err * x\n        b -= 0.01 * err\n"
    "    json.dump({'w': w, 'b': b, 'epoch': epoch}, open(f'ckpt/e{epoch}.json', 'w'))\n"
    "log = open('train.log', 'a')\nlog.write(f'{w:.6f}\\n')\nlog.flush()",
    "!sh -c 'ls ckpt | wc -l > count.txt'",
    "import time\nwhile not os.environ.get('GO'):\n    time.sleep(0.05)",
    "best = json.load(open('ckpt/e2.json'))\nlog.write('resumed\\n')\nlog.flush()\n"
    "print(round(best['w'], 6), round(best['b'], 6), open('count.txt').read().strip(),\n"
    "      open('train.log').read().split(), sorted(os.listdir('data')), nlpkg.VALUE)",
)


@pytest.fixture
def node_files(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The wheel the notebook installs, and a zip on a loopback HTTP server."""
    import functools
    import http.server
    import threading
    import zipfile

    from . import node_patterns

    wheels = node_patterns.build_wheel(tmp_path).parent
    wheels.chmod(0o755)
    served = tmp_path / "served"
    served.mkdir()
    with zipfile.ZipFile(served / "data.zip", "w") as zf:
        zf.writestr("train.csv", "".join(f"{x},{2 * x + 1}\n" for x in range(10)))
        zf.writestr("README", "toy data")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(served))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield wheels, f"http://127.0.0.1:{server.server_address[1]}/data.zip"
    finally:
        server.shutdown()
        server.server_close()


def _pod_like(wheels: Path, url: str) -> tuple[str, ...]:
    """What the Job gives the container: its working directory an emptyDir at a stable
    path (here a tmpfs: new with each container), HOME and TMPDIR inside it."""
    return (
        "--tmpfs", "/spotbook/work:rw,mode=1777", "-w", "/spotbook/work",
        "--tmpfs", "/opt/site:rw,mode=1777",
        "-v", f"{wheels}:/wheels:ro",
        "-e", "HOME=/spotbook/work/.home", "-e", "TMPDIR=/spotbook/work/.tmp",
        "-e", "SPOTBOOK_RUN_TMP=/spotbook/work/.tmp",
        "-e", "PIP_TARGET=/opt/site", "-e", "PYTHONPATH=/opt/site", "-e", f"NL_URL={url}",
    )  # fmt: skip


def test_a_run_killed_in_one_container_resumes_in_a_new_one_with_its_files(
    image: dict[str, Any],
    storages: dict[str, Storage],
    key_file: Path,
    node_files: tuple[Path, str],
    tmp_path: Path,
) -> None:
    """Killed in one container, resumed in a new one (empty working directory, home and
    temporary directory, the image's environment): the files the run wrote come back
    from the S3 store, the pip cell is replayed, and the notebook is the uninterrupted
    run's."""
    st = storages["s3"]
    wheels, url = node_files
    write_notebook(tmp_path / "nb.ipynb", *NODE_CELLS)
    stores = {}
    for name in ("ref", "rd"):
        stores[name] = f"{st.bucket()}/{name}"
        r = cli(
            "run", "nb.ipynb", "--run-dir", stores[name], "--snapshot", "every-cell",
            "--prepare-only", cwd=tmp_path, env=st.env,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
    pod = _pod_like(wheels, url)
    r = podman(
        *_run_args(f"sb-ref-{os.getpid()}", st, key_file, f"SPOTBOOK_RUN_DIR={stores['ref']}",
                   "GO=1", extra=("--rm", *pod)),
        check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    rd = stores["rd"]
    name = f"sb-node-{os.getpid()}"
    podman(*_run_args(name, st, key_file, f"SPOTBOOK_RUN_DIR={rd}", extra=("-d", *pod)))

    def at_the_gate() -> bool:
        state = podman("inspect", name, "--format", "{{.State.Status}}").stdout.strip()
        assert state == "running", podman("logs", name).stderr[-3000:]
        return _committed(rd) >= 4

    try:
        wait_for(at_the_gate, timeout=300, what="cells 0-3 in the store")
        podman("kill", "-s", "KILL", name)
        podman("wait", name, check=False)
    finally:
        podman("rm", "-f", name, check=False)
    env = (f"SPOTBOOK_RUN_DIR={rd}", "GO=1")
    r = podman(*_run_args(f"{name}-2", st, key_file, *env, extra=("--rm", *pod)), check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got, want = _output(rd), _output(stores["ref"])
    assert got == want
    assert "resumed" in json.dumps(got[-1])
    last = _status(rd, st, tmp_path)["attempts"][-1]
    assert last["resumed_from"] == 4 and last["files_restored"]["files"] >= 5
    assert last["environment_replayed"] == [0]
    assert last["fidelity"]["exact"], last["fidelity"]["may_differ"]
