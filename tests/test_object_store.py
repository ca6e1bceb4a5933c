"""The runner, resume and the worker on real object storage: moto's S3 server and
fake-gcs-server on loopback, each behind a proxy that fails, drops and loses a share
of requests. Every spotbook process here talks through the proxy; the test itself
reads the stores directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotbook._worker import resolve_target
from spotbook.store.runstore import RunStore

from .conftest import (
    NOTEBOOKS,
    RATES,
    cli,
    comparable,
    kill,
    load,
    marker_runs,
    start_cli,
    wait_for,
)
from .servers import Storage

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261129"))


@pytest.fixture(params=["s3", "gs", "az"])
def remote(request: pytest.FixtureRequest, storages: dict[str, Storage]) -> Storage:
    st: Storage = storages[request.param]
    return st


# Some cases test spotbook's own logic, the same on every store: one store is enough.
s3_only = pytest.mark.parametrize("remote", ["s3"], indirect=True)
gs_only = pytest.mark.parametrize("remote", ["gs"], indirect=True)


@pytest.fixture
def bucket(remote: Storage) -> str:
    return remote.bucket()


@pytest.fixture
def renv(remote: Storage, state_env: dict[str, str]) -> dict[str, str]:
    """The environment of a spotbook process: the proxy's endpoint, state.ipynb's files."""
    return {**remote.env, **state_env}


def records(url: str) -> int:
    return len(RunStore(url).cell_records())


def status(url: str, work: Path) -> dict[str, Any]:
    r = cli("status", url, "--json", cwd=work)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def upload(url: str, path: Path) -> None:
    import fsspec

    with fsspec.open(url, "wb") as fh:
        fh.write(path.read_bytes())


def download(url: str) -> dict[str, Any]:
    import fsspec

    with fsspec.open(url, "rb") as fh:
        data: dict[str, Any] = json.loads(fh.read())
        return data


_STORE_SCRIPT = """
import json, sys, threading
from spotbook.store.runstore import RunStore
from spotbook._worker import resolve_target
url, who = sys.argv[1], sys.argv[2]
store = RunStore(url)
for i in range(30):
    store.write(f"data/{who}-{i}", f"{who}:{i}".encode() * 100)
claimed = [store.claim_attempt({"who": who, "n": k}) for k in range(10)]
back = [store.read(f"data/{who}-{i}") == f"{who}:{i}".encode() * 100 for i in range(30)]
print(json.dumps({"claimed": claimed, "back": all(back)}))
"""


def test_store_writes_and_fences_hold_under_faults(remote: Storage, bucket: str) -> None:
    """Two processes write and race to claim attempts through a faulty proxy: every
    write lands once, every attempt number has exactly one owner."""
    url = f"{bucket}/store"
    before = remote.faults()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _STORE_SCRIPT, url, who],
            env={**os.environ, **remote.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for who in ("a", "b")
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [json.loads(out) for out, _ in outs]
    assert all(r["back"] for r in results)
    claimed_a, claimed_b = results[0]["claimed"], results[1]["claimed"]
    assert sorted(claimed_a + claimed_b) == list(range(1, 21))
    store = RunStore(url)
    for who, numbers in (("a", claimed_a), ("b", claimed_b)):
        for n in numbers:
            assert store.read_json(f"attempts/{n:04d}.json")["who"] == who
    after = remote.faults()
    injected = sum(after[k] - before[k] for k in ("failed", "dropped", "lost"))
    if RATES[remote.scheme]:
        assert injected > 0, (before, after)  # the faults happened and were survived


def test_a_document_past_its_bound_is_refused_by_a_ranged_read(
    remote: Storage, bucket: str
) -> None:
    """A huge object (a writer of the bucket made it so) is asked for with a ranged
    request: no more than the bound plus one byte is fetched, and it is refused by name."""
    from spotbook._errors import StoreIntegrityError

    store = RunStore(f"{bucket}/big")
    store.write("run.json", b"{" + b" " * 4096 + b"}")
    assert store.read("run.json", 8192) is not None
    before = remote.faults()
    with pytest.raises(StoreIntegrityError, match=r"big/run.json is larger than the"):
        store.read("run.json", 1024)
    assert remote.faults()["bytes_down"] - before["bytes_down"] < 4096
    assert store.read_json("run.json") == {}


def test_run_on_object_storage_matches_local(
    work: Path, remote: Storage, bucket: str, renv: dict, reference: dict
) -> None:
    """Input, output and run store all in the bucket."""
    upload(f"{bucket}/in/state.ipynb", work / "state.ipynb")
    rd = f"{bucket}/runs/r1"
    r = cli(
        "run",
        f"{bucket}/in/state.ipynb",
        f"{bucket}/out/state.ipynb",
        "--run-dir",
        rd,
        cwd=work,
        env=renv,
    )
    assert r.returncode == 0, r.stderr
    assert comparable(download(f"{bucket}/out/state.ipynb")) == comparable(reference)
    assert comparable(download(f"{rd}/output.ipynb")) == comparable(reference)
    doc = status(rd, work)
    assert doc["status"] == "succeeded" and doc["cells_done"] == 7


@s3_only
def test_missing_bucket_is_a_storage_error(work: Path, remote: Storage, renv: dict) -> None:
    r = cli(
        "run",
        "state.ipynb",
        "--run-dir",
        f"{remote.scheme}://no-such-bucket-here/r",
        cwd=work,
        env=renv,
    )
    assert r.returncode == 3, r.stderr
    assert "no-such-bucket-here" in r.stderr and "Traceback" not in r.stderr


# -- the container entrypoint, as a plain process with the Job's environment ----------


def job_env(remote: Storage, extra: dict[str, str]) -> dict[str, str]:
    """What the Job manifest gives the container (downward API and image)."""
    return {
        **remote.env,
        "POD_NAME": "nb-run-x7k2p",
        "POD_NAMESPACE": "default",
        "NODE_NAME": "gke-spot-gpu-pool-1a2b",
        "SPOTBOOK_IMAGE": "ghcr.io/example/spotbook:cpu",
        **extra,
    }


def test_worker_resumes_from_the_bucket_after_a_kill(
    work: Path, remote: Storage, bucket: str, state_env: dict, reference: dict
) -> None:
    rd = f"{bucket}/runs/job"
    r = cli("run", "state.ipynb", "--run-dir", rd, "--prepare-only", cwd=work, env=remote.env)
    assert r.returncode == 0, r.stderr
    env = job_env(remote, {**state_env, "SPOTBOOK_RUN_DIR": rd})
    proc = start_cli("worker", cwd=work, env=env)
    wait_for(lambda: records(rd) >= 3, timeout=120, what="worker progressing")
    kill(proc)  # the node is gone
    r = cli("worker", cwd=work, env={**env, "POD_NAME": "nb-run-q9w3z"})  # the new pod
    assert r.returncode == 0, r.stderr
    assert "ran\n" in r.stderr or "slow step done" in r.stderr  # cell output in the pod log
    assert comparable(download(f"{rd}/output.ipynb")) == comparable(reference)
    doc = status(rd, work)
    first, second = doc["attempts"]
    assert first["outcome"] == "killed" and second["outcome"] == "completed"
    assert (first["pod"], second["pod"]) == ("nb-run-x7k2p", "nb-run-q9w3z")
    assert second["node"] == "gke-spot-gpu-pool-1a2b"
    assert second["image"] == "ghcr.io/example/spotbook:cpu"
    text = cli("status", rd, cwd=work).stdout
    assert "nb-run-q9w3z" in text and "gke-spot-gpu-pool-1a2b" in text


@gs_only
def test_worker_with_the_classic_bucket_variables(
    work: Path, remote: Storage, bucket: str, state_env: dict, reference: dict
) -> None:
    upload(f"{bucket}/notebooks/state.ipynb", work / "state.ipynb")
    env = job_env(
        remote,
        {
            **state_env,
            "BUCKET_NAME": bucket.split("://")[1],  # a bare name means gs://
            "DOWNLOAD_FILE_PATH": "notebooks/state.ipynb",
            "UPLOAD_FILE_PATH": "results/state-out.ipynb",
        },
    )
    target = resolve_target(None, env)
    assert target.input_url == f"{bucket}/notebooks/state.ipynb"
    proc = start_cli("worker", "--grace", "0.2", cwd=work, env=env)
    wait_for(lambda: records(target.run_dir) >= 4, timeout=120, what="classic worker running")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    r = cli("worker", cwd=work, env=env)  # the Job starts a new pod
    assert r.returncode == 0, r.stderr
    assert comparable(download(f"{bucket}/results/state-out.ipynb")) == comparable(reference)
    assert marker_runs(work) == 1
    runs = RunStore(f"{bucket}/.spotbook/runs").names("")
    assert len(runs) == 1 and runs[0].startswith("job-")


def test_worker_without_configuration_exits_2(work: Path) -> None:
    env = {"SPOTBOOK_RUN_DIR": "", "BUCKET_NAME": "", "DOWNLOAD_FILE_PATH": ""}
    r = cli("worker", cwd=work, env=env)
    assert r.returncode == 2
    assert "SPOTBOOK_RUN_DIR" in r.stderr and "BUCKET_NAME" in r.stderr


# -- a training loop that checkpoints inside one long cell ---------------------------


def _train(work: Path, rd: str, env: dict[str, str], out: str) -> subprocess.Popen[str]:
    return start_cli(
        "run",
        "train_loop.ipynb",
        out,
        "--run-dir",
        rd,
        "--checkpoint-interval",
        "0.5",
        cwd=work,
        env=env,
    )


def _epochs(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.exists() else []


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_training_loop_stops_on_sigterm_and_continues(
    work: Path, storages: dict[str, Storage], where: str
) -> None:
    s3 = storages["s3"]
    (work / "train_loop.ipynb").write_bytes((NOTEBOOKS / "train_loop.ipynb").read_bytes())
    ref_log = work / "ref-epochs.txt"
    r = cli("run", "train_loop.ipynb", "ref.ipynb", cwd=work, env={"SB_EPOCH_LOG": str(ref_log)})
    assert r.returncode == 0, r.stderr
    assert _epochs(ref_log) == list(range(8))

    rd = f"{s3.bucket()}/runs/train" if where == "bucket" else str(work / "rd")
    log = work / "epochs.txt"
    env = {**s3.env, "SB_EPOCH_LOG": str(log)}
    proc = _train(work, rd, env, "out.ipynb")
    wait_for(lambda: len(_epochs(log)) >= 3, timeout=120, what="3 epochs")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    done_before = len(_epochs(log))
    assert done_before < 8
    r = cli("resume", rd, cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    # every epoch ran exactly once across the two attempts, and the result is the same
    assert _epochs(log) == list(range(8))
    assert comparable(load(work / "out.ipynb")) == comparable(load(work / "ref.ipynb"))
    attempts = status(rd, work)["attempts"]
    assert [a["outcome"] for a in attempts] == ["preempted", "completed"]
    # the loop saw preempted() and stopped early, inside the grace period
    assert attempts[0]["notice"]["cell"] == "stopped"
    shown = cli("status", rd, cwd=work, env=env).stdout
    stopped = (
        "the running cell stopped early (at its loop's checkpoint, or on spotbook.preempted())"
    )
    assert f"SIGTERM: {stopped}" in shown
    assert attempts[1]["resumed_from"] == 2  # the loop cell runs again, from its checkpoint
    if where == "bucket":
        assert attempts[0]["checkpoint_uploaded_bytes"] >= 200_000
        assert attempts[1]["checkpoint_restored_bytes"] >= 200_000
