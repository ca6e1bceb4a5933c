"""Object storage: save and restore of a 500 MB kernel state, and SIGTERM-to-exit with a
200 MB checkpoint directory, against moto's S3 server on loopback (and a local store for
comparison).

    .venv/bin/python bench/bench_storage.py [--mb 500] [--ckpt-mb 200]

Save = the snapshot after the cell that built the state (kernel side: pickling and
uploading). Restore = the resumed attempt's restore step (download, checks, unpickling),
after the first run was SIGKILLed. SIGTERM-to-exit = from the signal to the process's
exit code 75, with a training loop that polls spotbook.preempted() (cooperative) and with
a cell that ignores it (the runner waits --grace, then saves).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import spotbook_process, write_notebook  # noqa: E402
from tests.servers import start_s3  # noqa: E402

STATE = """import numpy as np
rng = np.random.default_rng(0)
parts = [rng.random({n}) for _ in range(5)]  # 5 arrays, {mb} MB in all
"""

COOPERATIVE = """import os, time, spotbook
ckpt = spotbook.checkpoint_dir()
blobs = [os.urandom({chunk}) for _ in range(4)]
def save(step):
    for i, b in enumerate(blobs):
        tmp = os.path.join(ckpt, f"part{{i}}.bin.tmp")
        with open(tmp, "wb") as fh:
            fh.write(b[:-8] + step.to_bytes(8, "little"))
        os.replace(tmp, os.path.join(ckpt, f"part{{i}}.bin"))
step = 0
while not spotbook.preempted():
    step += 1
    time.sleep(0.2)
    if step % 5 == 0:
        save(step)  # a checkpoint every second; the runner syncs on its own schedule
"""

STUBBORN = """import os, time, spotbook
ckpt = spotbook.checkpoint_dir()
for i in range(4):
    with open(os.path.join(ckpt, f"part{{i}}.bin"), "wb") as fh:
        fh.write(os.urandom({chunk}))
time.sleep(3600)  # never looks at spotbook.preempted()
"""


def _wait(pred, timeout: float = 600.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise TimeoutError


def save_restore(rd: str, tmp: Path, env: dict[str, str], mb: int) -> dict[str, float]:
    from spotbook.store.runstore import RunStore

    n = mb * 1_000_000 // 8 // 5
    nb = write_notebook(
        tmp / "state.ipynb",
        [STATE.format(n=n, mb=mb), "import time\ntime.sleep(600)", "print(len(parts))"],
    )
    proc = spotbook_process(
        "run", str(nb), "--run-dir", rd, "--snapshot", "every-cell", env=env, cwd=tmp
    )
    store = RunStore(rd)
    _wait(lambda: len(store.cell_records()) >= 1)
    proc.kill()
    proc.communicate()
    snap = store.read_json(f"state/snap/{store.names('state/snap')[-1]}")
    t0 = time.monotonic()
    # the resumed attempt restores, then runs the 600 s cell: stop it once restored
    proc = spotbook_process("resume", rd, env=env, cwd=tmp)
    _wait(lambda: len(store.attempt_numbers()) >= 2 and "restore_seconds" in (store.attempts()[-1]))
    resumed = time.monotonic() - t0
    proc.kill()
    proc.communicate()
    rec = store.attempts()[-1]
    return {
        "state_mb": mb,
        "save_s": snap["kernel_seconds"],
        "save_mb_per_s": snap["bytes_written"] / 1e6 / snap["kernel_seconds"],
        "restore_s": rec["restore_seconds"],
        "restore_mb_per_s": rec["restored_bytes"] / 1e6 / rec["restore_seconds"],
        "kernel_start_s": rec["kernel_start_seconds"],
        "resume_to_restored_s": resumed,
    }


def sigterm(
    rd: str, tmp: Path, env: dict[str, str], mb: int, cooperative: bool
) -> dict[str, float]:
    from spotbook.store.runstore import RunStore

    chunk = mb * 1_000_000 // 4
    src = (COOPERATIVE if cooperative else STUBBORN).format(chunk=chunk)
    nb = write_notebook(tmp / "ckpt.ipynb", ["x = 1", src, "print('done')"])
    proc = spotbook_process("run", str(nb), "--run-dir", rd, env=env, cwd=tmp)
    store = RunStore(rd)
    _wait(lambda: len(store.cell_records()) >= 1)
    time.sleep(4.0)  # the loop is running and has written its 4 files
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate()
    took = time.monotonic() - t0
    assert proc.returncode == 75, err
    rec = store.attempts()[-1]
    return {
        "ckpt_mb": mb,
        "sigterm_to_exit_s": took,
        "uploaded_mb": rec.get("checkpoint_uploaded_bytes", 0) / 1e6,
        "last_sync_s": rec.get("checkpoint_last_sync_seconds", 0.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=500)
    ap.add_argument("--ckpt-mb", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        s3 = start_s3(tmp, {})
        try:
            os.environ.update(s3.direct_env)
            env = dict(s3.direct_env)
            rows = []
            for where in ("s3", "local"):
                rd = f"{s3.bucket()}/run" if where == "s3" else str(tmp / f"rd-{where}")
                rows.append({"store": where, **save_restore(rd, tmp, env, args.mb)})
            print("| store | state | save | save MB/s | restore | restore MB/s | kernel start |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for r in rows:
                print(
                    f"| {r['store']} | {r['state_mb']} MB | {r['save_s']:.2f} s | "
                    f"{r['save_mb_per_s']:.0f} | {r['restore_s']:.2f} s | "
                    f"{r['restore_mb_per_s']:.0f} | {r['kernel_start_s']:.2f} s |"
                )
            print()
            print("| store | loop | checkpoint dir | SIGTERM→exit | uploaded at exit | last sync |")
            print("|---|---|---:|---:|---:|---:|")
            for cooperative in (True, False):
                rd = f"{s3.bucket()}/ckpt"
                r = sigterm(rd, tmp, env, args.ckpt_mb, cooperative)
                kind = "polls preempted()" if cooperative else "ignores it (--grace 8)"
                print(
                    f"| s3 | {kind} | {r['ckpt_mb']} MB | {r['sigterm_to_exit_s']:.2f} s | "
                    f"{r['uploaded_mb']:.0f} MB | {r['last_sync_s']:.2f} s |"
                )
            print(json.dumps(rows))
        finally:
            s3.stop()


if __name__ == "__main__":
    main()
