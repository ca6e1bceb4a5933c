"""Kill a real `spotbook run` (SIGKILL, SIGTERM) at chosen and random points, resume it,
and compare with an uninterrupted run."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import time
from pathlib import Path

import pytest

from .conftest import (
    cells_committed,
    cli,
    comparable,
    kill,
    load,
    marker_runs,
    start_cli,
    wait_for,
)

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261129"))


def _start(work: Path, env: dict[str, str], *extra: str):
    """`spotbook run state.ipynb out.ipynb --run-dir rd EXTRA...` in the background."""
    return start_cli(
        "run", "state.ipynb", "out.ipynb", "--run-dir", "rd", *extra, cwd=work, env=env
    )


def _resume(work: Path, rd: str, env: dict[str, str], *extra: str) -> None:
    r = cli("resume", rd, *extra, cwd=work, env=env)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("k", [1, 3, 4, 5])
def test_sigkill_after_cell_k_commits(work: Path, state_env: dict, reference: dict, k: int) -> None:
    rd = _kill_after(work, k, state_env)
    committed = cells_committed(rd)  # k, or more if fast cells finished before the kill
    _resume(work, "rd", state_env)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    if committed >= 4:  # the marker cell (3) had committed before the kill: never rerun
        assert marker_runs(work) == 1
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    first, second = doc["attempts"]
    assert first["outcome"] == "killed" and second["outcome"] == "completed"
    assert second["resumed_from"] == committed
    assert doc["preemptions"] == 1


def test_sigkill_while_a_cell_runs_default_policy(
    work: Path, state_env: dict, reference: dict
) -> None:
    rd = work / "rd"
    proc = _start(work, state_env)
    wait_for(lambda: cells_committed(rd) >= 4, what="slow cell started")
    kill(proc)  # inside the 1.5 s sleep of cell 4
    _resume(work, "rd", state_env)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    # auto policy snapshots after the 1 s marker cell, so it is not replayed
    assert marker_runs(work) == 1


def test_random_kill_points(work: Path, state_env: dict, reference: dict) -> None:
    rng = random.Random(SEED)
    for trial in range(3):
        rd = f"rd{trial}"
        (work / "marker.txt").unlink(missing_ok=True)
        proc = start_cli(
            "run",
            "state.ipynb",
            f"out{trial}.ipynb",
            "--run-dir",
            rd,
            "--snapshot",
            rng.choice(["every-cell", "auto"]),
            cwd=work,
            env=state_env,
        )
        wait_for(lambda rd=rd: (work / rd / "attempts").is_dir(), what="run started")
        time.sleep(rng.uniform(0.0, 5.0))  # a random instant of a ~6 s run
        kill(proc)
        _resume(work, rd, state_env)
        got = load(work / f"out{trial}.ipynb")
        assert comparable(got) == comparable(reference), f"seed {SEED} trial {trial}"


def test_sigkill_while_a_snapshot_is_written(work: Path) -> None:
    nb = load(work / "state.ipynb")
    nb["cells"][0]["source"] = "import os\nimport numpy as np\nbig = np.ones(40_000_000)\nn = 1"
    nb["cells"] = [
        *nb["cells"][:1],
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "x1",
            "metadata": {},
            "outputs": [],
            "source": "big[0] = 2\nn += 1\nprint(n, big.sum())",
        },
        {
            "cell_type": "code",
            "execution_count": None,
            "id": "x2",
            "metadata": {},
            "outputs": [],
            "source": "print(big[:3], n)",
        },
    ]
    (work / "big.ipynb").write_text(json.dumps(nb))
    assert cli("run", "big.ipynb", "ref.ipynb", "--snapshot", "off", cwd=work).returncode == 0
    rd = work / "rd"
    proc = start_cli(
        "run", "big.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot", "every-cell", cwd=work
    )
    blobs = rd / "state" / "blobs"
    wait_for(
        lambda: blobs.is_dir() and any(".tmp-" in n for n in os.listdir(blobs)),
        what="a snapshot blob being written",
    )
    kill(proc)
    _resume(work, "rd", {})
    assert comparable(load(work / "out.ipynb")) == comparable(load(work / "ref.ipynb"))


def test_sigterm_saves_and_exits_75_then_resumes(
    work: Path, state_env: dict, reference: dict
) -> None:
    rd = work / "rd"
    proc = _start(work, state_env, "--grace", "0.2")
    wait_for(lambda: cells_committed(rd) >= 4, what="slow cell started")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    assert "stopped on SIGTERM after saving progress" in err
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["status"] == "interrupted"
    assert doc["attempts"][0]["outcome"] == "preempted"
    partial = load(work / "out.ipynb")  # OUTPUT is written on the way out
    assert partial["metadata"]["spotbook"]["final"] is False
    _resume(work, "rd", state_env)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    assert marker_runs(work) == 1


def test_sigterm_lets_a_short_cell_finish_within_grace(work: Path, state_env: dict) -> None:
    rd = work / "rd"
    proc = _start(work, state_env, "--grace", "5")
    # the snapshot after the 1 s cell 3 is the last thing before the 1.5 s cell 4 starts
    wait_for(lambda: (rd / "state" / "snap" / "00003-a0001.json").exists(), what="snapshot")
    time.sleep(0.3)  # well inside cell 4's 1.5 s sleep
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    # the 1.5 s cell that was running finished inside the 5 s grace and was committed
    assert cells_committed(rd) == 5


def test_two_runners_on_one_store(work: Path, state_env: dict, reference: dict) -> None:
    rd = work / "rd"
    first = _start(work, state_env)
    wait_for(lambda: cells_committed(rd) >= 2, what="first runner progressing")
    second = start_cli("resume", "rd", cwd=work, env=state_env)
    outs = [p.communicate(timeout=120) for p in (first, second)]
    codes = sorted([first.returncode, second.returncode])
    assert codes == [0, 3], outs
    loser = outs[0][1] if first.returncode == 3 else outs[1][1]
    assert "superseded" in loser
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["status"] == "succeeded" and doc["cells_done"] == 7


def _kill_after(work: Path, k: int, env: dict, *extra: str) -> Path:
    rd = work / "rd"
    proc = _start(work, env, "--snapshot", "every-cell", *extra)
    wait_for(lambda: cells_committed(rd) >= k, what=f"{k} cells")
    kill(proc)
    return rd


def test_tampered_manifest_is_refused(work: Path, state_env: dict) -> None:
    rd = _kill_after(work, 3, state_env)
    snap = sorted((rd / "state" / "snap").iterdir())[-1]
    doc = json.loads(snap.read_text())
    doc["vars"]["table"]["sha256"] = doc["vars"]["blob"]["sha256"]
    snap.write_text(json.dumps(doc))
    r = cli("resume", "rd", cwd=work, env=state_env)
    assert r.returncode == 2, r.stderr
    assert "integrity check" in r.stderr and "Traceback" not in r.stderr


def test_tampered_blob_is_never_unpickled(work: Path, state_env: dict) -> None:
    rd = _kill_after(work, 3, state_env)
    evidence = work / "pwned.txt"

    class Evil:
        def __reduce__(self):
            return (open, (str(evidence), "w"))

    snap = sorted((rd / "state" / "snap").iterdir())[-1]
    digest = json.loads(snap.read_text())["vars"]["table"]["sha256"]
    (rd / "state" / "blobs" / digest).write_bytes(pickle.dumps(Evil()))
    r = cli("resume", "rd", cwd=work, env=state_env)
    assert r.returncode == 2, r.stderr
    assert "does not match its hash" in r.stderr
    assert not evidence.exists()


def test_key_from_environment_must_match(work: Path, state_env: dict) -> None:
    env = {**state_env, "SPOTBOOK_SNAPSHOT_KEY": "secret-one"}
    _kill_after(work, 3, env)
    r = cli("resume", "rd", cwd=work, env={**state_env, "SPOTBOOK_SNAPSHOT_KEY": "other"})
    assert r.returncode == 2 and "integrity" in r.stderr
    _resume(work, "rd", env)


def test_preemption_budget_exhausted_exits_5(work: Path, state_env: dict) -> None:
    _kill_after(work, 2, state_env, "--max-preemptions", "0")
    r = cli("resume", "rd", cwd=work, env=state_env)
    assert r.returncode == 5, r.stderr
    assert "--max-preemptions" in r.stderr
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["status"] == "failed"


def test_snapshot_off_replays_everything_and_still_matches(
    work: Path, state_env: dict, reference: dict
) -> None:
    _kill_after(work, 5, state_env, "--snapshot", "off")
    _resume(work, "rd", state_env)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    doc = json.loads(cli("status", "rd", "--json", cwd=work).stdout)
    assert doc["attempts"][1]["replayed"] == [0, 1, 2, 3, 4]


def test_changed_input_is_refused_on_resume_by_run(work: Path, state_env: dict) -> None:
    _kill_after(work, 2, state_env)
    nb = load(work / "state.ipynb")
    nb["cells"][-1]["source"] += "\nprint('changed')"
    (work / "state.ipynb").write_text(json.dumps(nb))
    r = cli("run", "state.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work, env=state_env)
    assert r.returncode == 2 and "--restart" in r.stderr
    # `resume` runs what was frozen at submit time, whatever happened to the file
    _resume(work, "rd", state_env)
    assert "changed" not in "".join(load(work / "out.ipynb")["cells"][-1]["source"])


def test_unfinished_run_continues_with_the_same_run_command(
    work: Path, state_env: dict, reference: dict
) -> None:
    _kill_after(work, 4, state_env)
    r = cli("run", "state.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work, env=state_env)
    assert r.returncode == 0, r.stderr
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    assert marker_runs(work) == 1


def test_unchanged_arrays_are_not_written_again_but_mutations_are_seen(work: Path) -> None:
    cells = [
        "import numpy as np\nbig = np.arange(2_000_000, dtype=np.float64)\nsmall = [1]",
        "small.append(2)",
        "big[123] = -1.0",
        "print(big[123], small)",
    ]
    nb = load(work / "state.ipynb")
    nb["cells"] = [{**nb["cells"][0], "id": f"m{i}", "source": src} for i, src in enumerate(cells)]
    (work / "arr.ipynb").write_text(json.dumps(nb))
    r = cli("run", "arr.ipynb", "--run-dir", "rd", "--snapshot", "every-cell", cwd=work)
    assert r.returncode == 0, r.stderr
    snaps = [json.loads(p.read_text()) for p in sorted((work / "rd" / "state" / "snap").iterdir())]
    digests = [s["vars"]["big"]["sha256"] for s in snaps]
    assert digests[0] == digests[1] != digests[2]  # unchanged, then mutated in place
    assert snaps[1]["bytes_written"] < 1000  # the 16 MB array was not written again
    blob = work / "rd" / "state" / "blobs" / digests[2]
    assert pickle.loads(blob.read_bytes())[123] == -1.0
