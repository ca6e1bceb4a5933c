"""Kernel state to and from object stores: spotbook's snapshot and restore beside one
single-stream ``put``/``get`` of the same state with the storage library, in one run.

    .venv/bin/python bench/bench_object_store.py [--mb 1000] [--stores s3,gs,az]

Against moto's S3 server, fake-gcs-server and Azurite on loopback (started here, no fault
proxy in between). The state is 8 numpy arrays of ``--mb`` MB in all, built by the
notebook's first cell.

- spotbook save: the snapshot after that cell, taken synchronously
  (``--no-snapshot-background``); its manifest's ``written_seconds``: from the request to
  the kernel until every blob was in the store (pickling and hashing in the kernel, then
  uploading the blobs the store lacks, 8 at a time).
- spotbook restore: the resumed attempt's ``restore_seconds`` (downloading the blobs,
  checking their hashes, unpickling), after the first attempt was SIGKILLed.
- single stream: ``pickle.dumps`` of the same arrays (protocol 5, in this process), then
  one ``pipe_file`` of those bytes to the bucket with the store's fsspec library
  (s3fs, gcsfs, adlfs), and one ``cat_file`` and ``pickle.loads`` back; "put"/"get" are
  the transfers alone, "+pickle" with the (un)pickling.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import spotbook_process, write_notebook  # noqa: E402
from tests.servers import Storage, start_azure, start_gcs, start_s3  # noqa: E402

PARTS = 8
STATE = """import numpy as np
rng = np.random.default_rng(0)
state = {{f"a{{i}}": rng.random({n}) for i in range({parts})}}  # {mb} MB in all
"""


def _arrays(mb: int) -> dict[str, Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    n = mb * 1_000_000 // 8 // PARTS
    return {f"a{i}": rng.random(n) for i in range(PARTS)}


def _wait(pred: Any, proc: subprocess.Popen[str], timeout: float = 900.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"spotbook ended early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.05)
    raise TimeoutError


def spotbook_case(url: str, tmp: Path, env: dict[str, str], mb: int) -> dict[str, float]:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        from spotbook.store.runstore import RunStore

        n = mb * 1_000_000 // 8 // PARTS
        nb = write_notebook(
            tmp / "state.ipynb",
            [STATE.format(n=n, parts=PARTS, mb=mb), "import time\ntime.sleep(3600)", "1"],
        )
        rd = f"{url}/run"
        proc = spotbook_process(
            "run", str(nb), "--run-dir", rd, "--snapshot", "every-cell",
            "--no-snapshot-background", env=env, cwd=tmp,
        )  # fmt: skip
        store = RunStore(rd)
        _wait(lambda: len(store.cell_records()) >= 1, proc)
        proc.kill()
        proc.communicate()
        (key,) = store.snapshot_keys().values()
        snap = store.read_snapshot(key) or {}
        proc = spotbook_process("resume", rd, env=env, cwd=tmp)
        _wait(
            lambda: len(store.attempt_numbers()) >= 2 and "restore_seconds" in store.attempts()[-1],
            proc,
        )
        proc.kill()
        proc.communicate()
        rec = store.attempts()[-1]
        return {
            "bytes": float(snap["bytes_written"]),
            "save": float(snap["written_seconds"]),
            "restore": float(rec["restore_seconds"]),
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)


def single_stream(storage: Storage, url: str, mb: int) -> dict[str, float]:
    import fsspec

    saved = dict(os.environ)
    os.environ.update(storage.direct_env)
    try:
        fs = fsspec.filesystem(storage.scheme, skip_instance_cache=True)
        values = _arrays(mb)
        path = f"{url.split('://', 1)[1]}/single/state.pkl"
        t0 = time.perf_counter()
        data = pickle.dumps(values, protocol=5)
        t1 = time.perf_counter()
        fs.pipe_file(path, data)
        t2 = time.perf_counter()
        got = fs.cat_file(path)
        t3 = time.perf_counter()
        back = pickle.loads(got)
        t4 = time.perf_counter()
        assert len(got) == len(data) and set(back) == set(values)
        return {
            "bytes": float(len(data)),
            "put": t2 - t1,
            "put+pickle": t2 - t0,
            "get": t3 - t2,
            "get+pickle": t4 - t2,
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)


STARTERS = {"s3": start_s3, "gs": start_gcs, "az": start_azure}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--stores", default="s3,gs,az")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for scheme in args.stores.split(","):
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-os-{scheme}-"))
        storage = STARTERS[scheme](tmp, {})
        try:
            url = storage.bucket()
            one = single_stream(storage, url, args.mb)
            ours = spotbook_case(url, tmp, storage.direct_env, args.mb)
            rows.append({"store": scheme, "mb": args.mb, "spotbook": ours, "single": one})
        finally:
            storage.stop()
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"state: {PARTS} numpy arrays, {args.mb} MB; {os.cpu_count()} cores; loopback servers")
    print(
        f"{'store':<6} {'spotbook save':>14} {'single put':>11} {'put+pickle':>11} {'ratio':>6}"
        f" {'spotbook restore':>17} {'single get':>11} {'get+pickle':>11} {'ratio':>6}"
    )
    for r in rows:
        s, o = r["spotbook"], r["single"]
        print(
            f"{r['store']:<6} {s['save']:>12.2f} s {o['put']:>9.2f} s {o['put+pickle']:>9.2f} s"
            f" {o['put+pickle'] / s['save']:>5.2f}x {s['restore']:>15.2f} s {o['get']:>9.2f} s"
            f" {o['get+pickle']:>9.2f} s {o['get+pickle'] / s['restore']:>5.2f}x"
        )
    print("ratio: the single stream's time (with pickling) over spotbook's; above 1: faster")


if __name__ == "__main__":
    main()
