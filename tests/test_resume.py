"""Kill a real `spotbook run` (SIGKILL, SIGTERM) at chosen and random points, resume it,
and compare with an uninterrupted run. Each case runs with its store on the local disk
and, where marked, on real S3 and GCS servers behind a proxy that injects faults."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import signal
import struct
import subprocess
from pathlib import Path

import pytest

from .conftest import (
    Place,
    cli,
    comparable,
    kill,
    load,
    marker_runs,
    on,
    start_cli,
    wait_for,
    write_notebook,
)

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261129"))


def _start(work: Path, place: Place, *extra: str):
    """`spotbook run state.ipynb out.ipynb --run-dir RD EXTRA...` in the background."""
    return start_cli(
        "run", "state.ipynb", "out.ipynb", "--run-dir", place.rd, *extra, cwd=work, env=place.env
    )


def _resume(work: Path, place: Place, *extra: str) -> None:
    r = cli("resume", place.rd, *extra, cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr


def _status(work: Path, place: Place) -> dict:
    r = cli("status", place.rd, "--json", cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _kill_after(work: Path, place: Place, k: int, *extra: str) -> None:
    proc = _start(work, place, "--snapshot", "every-cell", *extra)
    wait_for(lambda: place.committed() >= k, timeout=120, what=f"{k} cells")
    kill(proc)


@pytest.mark.parametrize(
    ("where", "k"),
    [
        ("local", 1),
        ("local", 3),
        ("local", 4),
        ("local", 5),
        ("s3", 1),
        ("s3", 4),
        ("gs", 3),
        ("az", 4),
    ],
    indirect=["where"],
)
def test_sigkill_after_cell_k_commits(work: Path, place: Place, reference: dict, k: int) -> None:
    _kill_after(work, place, k)
    committed = place.committed()  # k, or more if fast cells finished before the kill
    _resume(work, place)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    if committed >= 4:  # the marker cell (3) had committed before the kill: never rerun
        assert marker_runs(work) == 1
    doc = _status(work, place)
    first, second = doc["attempts"]
    assert first["outcome"] == "killed" and second["outcome"] == "completed"
    assert second["resumed_from"] == committed
    assert doc["preemptions"] == 1


def test_sigkill_while_a_cell_runs_default_policy(
    work: Path, place: Place, reference: dict
) -> None:
    proc = _start(work, place)
    wait_for(lambda: place.committed() >= 4, what="slow cell started")
    kill(proc)  # inside the 1.5 s sleep of cell 4
    _resume(work, place)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    # auto policy snapshots after the 1 s marker cell, so it is not replayed
    assert marker_runs(work) == 1


@on("local", "s3")
def test_random_kill_points(work: Path, place: Place, reference: dict) -> None:
    """A kill at a random instant of the run, drawn from the duration an uninterrupted run
    took on this machine; the notebook's gate cell (5) waits for a file the test creates
    after the kill, so the kill lands before the run can end, on any machine."""
    rng = random.Random(f"{SEED}-{place.kind}")
    seconds = float(reference["metadata"]["papermill"]["duration"])
    for trial in range(3):
        run = place.sub(str(trial))
        gate = work / f"gate{trial}"
        env = {**run.env, "SB_GATE": str(gate)}
        (work / "marker.txt").unlink(missing_ok=True)
        proc = start_cli(
            "run",
            "state.ipynb",
            f"out{trial}.ipynb",
            "--run-dir",
            run.rd,
            "--snapshot",
            rng.choice(["every-cell", "auto"]),
            cwd=work,
            env=env,
        )
        wait_for(lambda run=run: run.store().attempt_numbers(), timeout=60, what="run started")
        with contextlib.suppress(subprocess.TimeoutExpired):  # ends early only on a crash
            proc.wait(timeout=rng.uniform(0.0, seconds))
        code, err = kill(proc)
        assert code == -signal.SIGKILL, f"the run ended before the kill: {err}"
        gate.touch()
        r = cli("resume", run.rd, cwd=work, env=env)
        assert r.returncode == 0, r.stderr
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
    assert cli("resume", "rd", cwd=work).returncode == 0
    assert comparable(load(work / "out.ipynb")) == comparable(load(work / "ref.ipynb"))


@on("local", "s3", "gs", "az")
def test_sigterm_saves_and_exits_75_then_resumes(work: Path, place: Place, reference: dict) -> None:
    proc = _start(work, place, "--grace", "0.2")
    wait_for(lambda: place.committed() >= 4, timeout=120, what="slow cell started")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    assert "stopped on SIGTERM after saving progress" in err
    doc = _status(work, place)
    assert doc["status"] == "interrupted"
    assert doc["attempts"][0]["outcome"] == "preempted"
    partial = load(work / "out.ipynb")  # OUTPUT is written on the way out
    assert partial["metadata"]["spotbook"]["final"] is False
    _resume(work, place)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    assert marker_runs(work) == 1


@on("local", "s3")
def test_sigterm_lets_a_short_cell_finish_within_grace(work: Path, place: Place) -> None:
    # events, not timing: the test signals once the cell has started, and the cell ends
    # once the notice has reached it (its file exists), well inside the grace
    write_notebook(
        work / "grace.ipynb",
        "x = 1",
        "import os, time\nopen('started', 'w').close()\n"
        "while not os.path.exists(os.environ['SPOTBOOK_NOTICE_FILE']):\n"
        "    time.sleep(0.01)\nx = 2",
        "print(x)",
    )
    proc = start_cli(
        "run", "grace.ipynb", "out.ipynb", "--run-dir", place.rd, "--grace", "60",
        cwd=work, env=place.env,
    )  # fmt: skip
    wait_for(lambda: (work / "started").exists(), timeout=120, what="the cell to start")
    code, err = kill(proc, signal.SIGTERM)
    assert code == 75, err
    # the cell that was running finished inside the grace and was committed
    assert place.committed() == 2
    notice = _status(work, place)["attempts"][0]["notice"]
    assert notice["signal"] == "SIGTERM" and notice["cell"] == "finished"


@on("local", "s3", "gs", "az")
def test_two_runners_on_one_store(work: Path, place: Place) -> None:
    """A second runner takes over while the first is inside a cell (events, not timing:
    the cell goes on only once the second runner's attempt exists): the first loses the
    fence at its next commit (exit 3), the second finishes the run."""
    write_notebook(
        work / "two.ipynb",
        "x = 1",
        "import os, time\nwhile not os.path.exists('go'):\n    time.sleep(0.01)\nx += 1",
        "print(x)",
    )
    first = start_cli(
        "run", "two.ipynb", "out.ipynb", "--run-dir", place.rd, "--snapshot", "every-cell",
        cwd=work, env=place.env,
    )  # fmt: skip
    wait_for(lambda: place.committed() >= 1, timeout=120, what="the first runner's cell 0")
    second = start_cli("resume", place.rd, cwd=work, env=place.env)
    wait_for(lambda: place.store().exists("attempts/0002.json"), timeout=120, what="the takeover")
    (work / "go").write_text("")
    outs = [p.communicate(timeout=300) for p in (first, second)]
    assert (first.returncode, second.returncode) == (3, 0), outs
    assert "superseded" in outs[0][1]
    out = load(work / "out.ipynb")
    assert "2" in "".join(out["cells"][-1]["outputs"][0]["text"])
    doc = _status(work, place)
    assert doc["status"] == "succeeded" and doc["cells_done"] == 3
    # the loser closed its own record: not a preemption, not against the budget
    assert [a["outcome"] for a in doc["attempts"]] == ["superseded", "completed"]
    assert doc["preemptions"] == 0


def _last_snapshot(place: Place) -> tuple[str, dict]:
    store = place.store()
    name = f"state/snap/{store.names('state/snap')[-1]}"
    return name, store.read_json(name)


@on("local", "s3")
def test_tampered_manifest_is_refused(work: Path, place: Place) -> None:
    _kill_after(work, place, 3)
    name, doc = _last_snapshot(place)
    doc["stream"]["buffers"].append(doc["stream"]["stream"])
    place.store().write_json(name, doc)
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode == 2, r.stderr
    assert "integrity check" in r.stderr and "Traceback" not in r.stderr


@on("local", "s3", "gs")
def test_tampered_blob_is_never_unpickled(work: Path, place: Place) -> None:
    _kill_after(work, place, 3)
    evidence = work / "pwned.txt"

    class Evil:
        def __reduce__(self):
            return (open, (str(evidence), "w"))

    _, doc = _last_snapshot(place)
    digest = doc["stream"]["stream"]
    place.store().write(place.store().blob_path(digest), pickle.dumps(Evil()))
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode == 2, r.stderr
    assert "does not match its hash" in r.stderr and "Traceback" not in r.stderr
    assert not evidence.exists()


@on("local", "s3")
def test_key_from_environment_must_match(work: Path, place: Place) -> None:
    one = {**place.env, "SPOTBOOK_SNAPSHOT_KEY": "one" * 11}
    keyed = Place(place.kind, place.rd, place.url, one)
    _kill_after(work, keyed, 3)
    wrong = {**place.env, "SPOTBOOK_SNAPSHOT_KEY": "other" * 7}
    r = cli("resume", place.rd, cwd=work, env=wrong)
    assert r.returncode == 2 and "another key" in r.stderr
    _resume(work, keyed)


@on("local", "s3")
def test_preemption_budget_exhausted_exits_5(work: Path, place: Place) -> None:
    _kill_after(work, place, 2, "--max-preemptions", "0")
    r = cli("resume", place.rd, cwd=work, env=place.env)
    assert r.returncode == 5, r.stderr
    assert "--max-preemptions" in r.stderr
    assert _status(work, place)["status"] == "failed"


@on("local", "s3")
def test_snapshot_off_replays_everything_and_still_matches(
    work: Path, place: Place, reference: dict
) -> None:
    _kill_after(work, place, 5, "--snapshot", "off")
    _resume(work, place)
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    assert _status(work, place)["attempts"][1]["replayed"] == [0, 1, 2, 3, 4]


@on("local", "gs")
def test_changed_input_is_refused_on_resume_by_run(work: Path, place: Place) -> None:
    _kill_after(work, place, 2)
    nb = load(work / "state.ipynb")
    nb["cells"][-1]["source"] += "\nprint('changed')"
    (work / "state.ipynb").write_text(json.dumps(nb))
    r = cli("run", "state.ipynb", "out.ipynb", "--run-dir", place.rd, cwd=work, env=place.env)
    assert r.returncode == 2 and "--restart" in r.stderr
    # `resume` runs what was frozen at submit time, whatever happened to the file
    _resume(work, place)
    assert "changed" not in "".join(load(work / "out.ipynb")["cells"][-1]["source"])


@on("local", "s3")
def test_unfinished_run_continues_with_the_same_run_command(
    work: Path, place: Place, reference: dict
) -> None:
    _kill_after(work, place, 4)
    r = cli("run", "state.ipynb", "out.ipynb", "--run-dir", place.rd, cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    assert comparable(load(work / "out.ipynb")) == comparable(reference)
    assert marker_runs(work) == 1


@on("local", "s3")
def test_unchanged_arrays_are_not_written_again_but_mutations_are_seen(
    work: Path, place: Place
) -> None:
    cells = [
        "import numpy as np\nbig = np.arange(2_000_000, dtype=np.float64)\nsmall = [1]",
        "small.append(2)",
        "big[123] = -1.0",
        "print(big[123], small)",
    ]
    nb = load(work / "state.ipynb")
    nb["cells"] = [{**nb["cells"][0], "id": f"m{i}", "source": src} for i, src in enumerate(cells)]
    (work / "arr.ipynb").write_text(json.dumps(nb))
    r = cli(
        "run",
        "arr.ipynb",
        "--run-dir",
        place.rd,
        "--snapshot",
        "every-cell",
        cwd=work,
        env=place.env,
    )
    assert r.returncode == 0, r.stderr
    store = place.store()
    snaps = [store.read_json(f"state/snap/{n}") for n in store.names("state/snap")]
    # the array's data is an out-of-band buffer of its own: unchanged, then mutated in place
    digests = [s["stream"]["buffers"] for s in snaps]
    assert len(digests[0]) == 1 and digests[0] == digests[1] != digests[2]
    assert snaps[1]["bytes_written"] < 100_000  # the 16 MB array was not written again
    data = store.read(store.blob_path(digests[2][0]))
    assert len(data) == 16_000_000 and struct.unpack_from("<d", data, 123 * 8)[0] == -1.0
