"""A kill inside a training cell loses at most one checkpoint interval (issue 57).

A cell's top-level ``for`` loop checkpoints at its iteration boundaries; the run is killed
for real (SIGKILL, or the node's SIGTERM) while an iteration runs, and the resume goes on
at the next iteration: the notebook is the one an uninterrupted run gives (losses printed
at full precision, a hash of the final weights, the file the loop appends to), and the
iterations run again are at most the one the kill interrupted.

Kills are placed on the run's own events: the notebook holds iteration ``h`` until the
test lets it go (a file, ``hold-h``/``go-h``), and the test kills once the store holds
the checkpoint after iteration ``h - 1`` — never after a sleep.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from spotbook.store.runstore import RunStore

from .conftest import (
    Place,
    cli,
    comparable,
    kill,
    load,
    made_once,
    on,
    start_cli,
    wait_for,
    wipe_node,
    write_notebook,
)

pytestmark = pytest.mark.slow
SEED = int(os.environ.get("SPOTBOOK_TEST_SEED", "20261207"))
EPOCHS = 12

SETUP = """\
import hashlib, os, time
import numpy as np
HOLD = os.environ["LOOP_HOLD_DIR"]
def hold(epoch):
    # the test's event: iteration `epoch` waits here while hold-<epoch> exists
    if os.path.exists(f"{HOLD}/hold-{epoch}"):
        open(f"{HOLD}/held-{epoch}", "w").close()
        while not os.path.exists(f"{HOLD}/go-{epoch}"):
            time.sleep(0.005)
rng = np.random.default_rng(7)
X = rng.normal(size=(256, 32))
y = X @ np.linspace(-1, 1, 32) + 0.1 * rng.normal(size=256)
w = np.zeros(32)
"""

TRAIN = f"""\
losses = []
print("training")
for epoch in range({EPOCHS}):
    batch = rng.choice(len(y), size=64, replace=False)
    g = X[batch].T @ (X[batch] @ w - y[batch]) / 64
    w -= 0.05 * g
    loss = float(((X @ w - y) ** 2).mean())
    losses.append(loss)
    with open("train.log", "a") as log:
        log.write(f"{{epoch}} {{loss!r}}\\n")
    hold(epoch)
    print(f"epoch {{epoch}} loss {{loss!r}}")
print("weights", hashlib.sha256(w.tobytes()).hexdigest())
"""

REPORT = """\
print(len(losses), repr(losses[-1]))
print(hashlib.sha256(open("train.log", "rb").read()).hexdigest())
"""

# the same loop inside a function the notebook defines, called by a later cell
TRAIN_DEF = """\
def train(w, epochs, lr=0.05):
    \"\"\"One pass of minibatch gradient descent per epoch.\"\"\"
    losses = []
    print("training")
    for epoch in range(epochs):
        batch = rng.choice(len(y), size=64, replace=False)
        g = X[batch].T @ (X[batch] @ w - y[batch]) / 64
        w = w - lr * g
        loss = float(((X @ w - y) ** 2).mean())
        losses.append(loss)
        with open("train.log", "a") as log:
            log.write(f"{epoch} {loss!r}\\n")
        hold(epoch)
        print(f"epoch {epoch} loss {loss!r}")
    print("weights", hashlib.sha256(w.tobytes()).hexdigest())
    return w, losses
"""
CALL = f"""\
print("calling", train.__doc__)
w, losses = train(w, {EPOCHS})
"""
# a torch training loop: a model, SGD with momentum, a learning-rate schedule and a
# DataLoader that shuffles (its order drawn from torch's generator at each epoch)
TORCH = f"""\
import torch
torch.manual_seed(3)
Xt = torch.randn(96, 8)
Yt = Xt @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.05 * torch.randn(96, 1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(Xt, Yt), batch_size=16, shuffle=True
)
losses = []
for epoch in range({EPOCHS}):
    for xb, yb in loader:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
    sched.step()
    losses.append(loss.item())
    with open("train.log", "a") as log:
        log.write(f"{{epoch}} {{loss.item()!r}}\\n")
    hold(epoch)
    print(f"epoch {{epoch}} loss {{loss.item()!r}} lr {{sched.get_last_lr()[0]!r}}")
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
print("weights", hashlib.sha256(weights).hexdigest())
"""
# shape -> the notebook's cells, and the cell the training loop runs in
SHAPES = {
    "cell": ((SETUP, TRAIN, REPORT), 1),
    "function": ((SETUP, TRAIN_DEF, CALL, REPORT), 2),
    "torch": ((SETUP, TORCH, REPORT), 1),
}


def _write(path: Path, shape: str = "cell") -> None:
    write_notebook(path, *SHAPES[shape][0])


@pytest.fixture(scope="session")
def loop_references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """Each shape's notebook run once, uninterrupted."""

    def make(where: Path) -> dict[str, list[Any]]:
        (where / "hold").mkdir()
        env = {"LOOP_HOLD_DIR": str(where / "hold")}
        out = {}
        for shape in SHAPES:
            if shape == "torch" and not _torch():
                continue
            _write(where / f"{shape}.ipynb", shape)
            r = cli("run", f"{shape}.ipynb", f"{shape}-ref.ipynb", cwd=where, env=env)
            assert r.returncode == 0, r.stderr
            out[shape] = comparable(load(where / f"{shape}-ref.ipynb"))
            (where / "train.log").unlink()
        return out

    made = made_once(tmp_path_factory, "in-cell-refs", make)
    found: dict[str, list[Any]] = json.loads(json.dumps(made))
    return found


@pytest.fixture
def loop_reference(loop_references: dict[str, list[Any]]) -> list[Any]:
    return loop_references["cell"]


def _comparable(path: Path) -> list[Any]:
    """:func:`comparable`, as the reference made once is read back (JSON)."""
    found: list[Any] = json.loads(json.dumps(comparable(load(path))))
    return found


def _checkpointed(place: Place, cell: int) -> int:
    """The iteration the newest checkpoint inside ``cell`` was taken after (-1: none)."""
    store = RunStore(place.url)
    best = -1
    for name in store.names("state/loop"):
        if not name.startswith(f"{cell:05d}-"):
            continue
        doc = store.read_json(f"state/loop/{name}") or {}
        best = max(best, int((doc.get("in_cell") or {}).get("iteration", -1)))
    return best


def _node(work: Path, new_node: bool) -> dict[str, str]:
    """HOME and TMPDIR of the node: folders of the test's own where the node is wiped."""
    if not new_node:
        return {}
    env = {}
    for var, name in (("HOME", "home"), ("TMPDIR", "tmp")):
        env[var] = str(work.parent / f"{work.name}-{name}")
        os.makedirs(env[var], exist_ok=True)
    return env


def _killed_at(
    args: list[str],
    work: Path,
    env: dict[str, str],
    place: Place,
    hold: Path,
    h: int,
    cell: int = 1,
) -> None:
    """Run ``spotbook ARGS`` until the checkpoint after iteration ``h - 1`` of the loop in
    ``cell`` is in the store and iteration ``h`` is held, then SIGKILL it (the node is
    gone)."""
    (hold / f"hold-{h}").touch()
    proc = start_cli(*args, cwd=work, env=env)
    wait_for(
        lambda: (hold / f"held-{h}").exists() and _checkpointed(place, cell) >= h,
        timeout=120,
        what=f"the checkpoint after iteration {h - 1}",
        proc=proc,
    )
    code, err = kill(proc)
    assert code == -signal.SIGKILL, err
    (hold / f"go-{h}").touch()


def _attempts(work: Path, place: Place) -> list[dict[str, Any]]:
    r = cli("status", place.rd, "--json", cwd=work, env=place.env)
    assert r.returncode == 0, r.stderr
    attempts: list[dict[str, Any]] = json.loads(r.stdout)["attempts"]
    return attempts


def _torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@on("local", "s3")
@pytest.mark.parametrize("new_node", [False, True], ids=["same-disk", "new-node"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_loop_killed_twice_goes_on_at_the_next_iteration(
    work: Path,
    place: Place,
    loop_references: dict[str, list[Any]],
    new_node: bool,
    shape: str,
) -> None:
    if shape == "torch" and not _torch():
        pytest.skip("torch is not installed (scripts/check.sh installs it)")
    _write(work / "train.ipynb", shape)
    cell = SHAPES[shape][1]
    hold = work.parent / f"{work.name}-hold"
    hold.mkdir()
    node = _node(work, new_node)
    env = {**place.env, "LOOP_HOLD_DIR": str(hold), **node}
    rng = random.Random(f"{SEED}-{place.kind}-{new_node}-{shape}")
    h1, h2 = sorted(rng.sample(range(1, EPOCHS), 2))
    run = ["run", "train.ipynb", "out.ipynb", "--run-dir", place.rd, "--snapshot-interval", "0"]
    _killed_at(run, work, env, place, hold, h1, cell)
    if new_node:
        wipe_node(work, node)
    _killed_at(["resume", place.rd], work, env, place, hold, h2, cell)
    if new_node:
        wipe_node(work, node)
    r = cli("resume", place.rd, cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert _comparable(work / "out.ipynb") == loop_references[shape]
    attempts = _attempts(work, place)
    # each resume went on inside the training cell, at the iteration the kill interrupted:
    # nothing before it ran again (the iterations redone: that one only)
    inside = [a.get("resumed_in_cell") for a in attempts[1:]]
    assert [(i or {}).get("iteration") for i in inside] == [h1, h2], attempts
    assert all(i["cell"] == cell and i["loop"] == 0 and i["total"] == EPOCHS for i in inside)
    assert [a.get("replayed") for a in attempts[1:]] == [[], []]
    assert f"restored the kernel's state inside cell {cell + 1}, iteration" in r.stderr
    if shape == "function":
        assert "of its loop 1 of function train()" in r.stderr
    assert all(a["fidelity"]["exact"] for a in attempts[1:]), attempts


def test_the_nodes_notice_inside_a_loop_checkpoints_at_the_next_boundary(
    work: Path, loop_reference: list[Any]
) -> None:
    """SIGTERM while an iteration runs: the loop saves at the end of that iteration and
    stops there (exit 75), well within the notice; the resume runs no iteration again."""
    _write(work / "train.ipynb")
    hold = work.parent / f"{work.name}-hold"
    hold.mkdir()
    # the runner's own folder (its notice file) in a folder of the test's
    tmp = work.parent / f"{work.name}-tmp"
    tmp.mkdir()
    env = {"LOOP_HOLD_DIR": str(hold), "TMPDIR": str(tmp)}
    h = random.Random(f"{SEED}-notice").randrange(1, EPOCHS)
    (hold / f"hold-{h}").touch()
    # the default interval (Young/Daly): no checkpoint is due yet in a run of seconds
    proc = start_cli("run", "train.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work, env=env)
    wait_for(lambda: (hold / f"held-{h}").exists(), 120, f"iteration {h} held", proc)
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: list(tmp.glob("spotbook-*/notice")), 60, "the runner's notice", proc)
    (hold / f"go-{h}").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    r = cli("resume", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert _comparable(work / "out.ipynb") == loop_reference
    first, second = _attempts(work, Place("local", "rd", str(work / "rd"), env))
    assert first["outcome"] == "preempted"
    assert second["resumed_in_cell"]["iteration"] == h + 1  # the interrupted one finished
    assert first.get("loop_checkpoints") == 1


UNRESUMABLE = """\
def batches():
    yield from range(6)
total = 0
for b in batches():
    total += b
    hold(b)
    print("batch", b, total)
"""


def test_a_loop_that_cannot_be_resumed_reruns_its_cell_and_is_named(work: Path) -> None:
    """A generator cannot be saved mid-way: the cell runs again from its first line, the
    report says so (not "nothing known to differ"), and --strict-resume refuses it."""
    write_notebook(work / "gen.ipynb", SETUP, UNRESUMABLE)
    hold = work.parent / f"{work.name}-hold"
    hold.mkdir()
    env = {"LOOP_HOLD_DIR": str(hold)}
    (hold / "hold-3").touch()
    proc = start_cli(
        "run", "gen.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot-interval", "0",
        cwd=work, env=env,
    )  # fmt: skip
    # the attempt record names the loop before the first item is drawn
    wait_for(lambda: (hold / "held-3").exists(), 120, "batch 3 held", proc)
    place = Place("local", "rd", str(work / "rd"), env)
    wait_for(
        lambda: any(a.get("loops_not_resumable") for a in RunStore(place.url).attempts()),
        60,
        "the loop named as not resumable",
        proc,
    )
    # (the snapshot after cell 1 is written in the background: committed with its record)
    wait_for(lambda: place.committed() >= 1, 60, "cell 1 committed", proc)
    assert _checkpointed(place, 1) == -1
    code, err = kill(proc)
    assert code == -signal.SIGKILL, err
    (hold / "go-3").touch()
    strict = cli("resume", "rd", "--strict-resume", cwd=work, env=env)
    assert strict.returncode == 6, strict.stderr
    assert "is not a resume point" in strict.stderr
    r = cli("resume", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    last = _attempts(work, place)[-1]
    said = last["fidelity"]["may_differ"]
    assert any("cell 2 runs again from its first line" in s and "generator" in s for s in said)
    outputs = load(work / "out.ipynb")["cells"][1]["outputs"]
    assert "".join(outputs[0]["text"]).splitlines()[-1] == "batch 5 15"


def test_simulate_models_a_long_training_cell_with_checkpoints_inside_it(work: Path) -> None:
    """`spotbook simulate` of a run whose cell ran a resumable loop: the loop run to 3 h
    (one cell, not 3 h of cells), preempted once an hour, costs about what an
    uninterrupted run costs when resumed inside the cell, and several times that when a
    preemption loses the whole cell (resumed between cells only, as before issue 57)."""
    write_notebook(work / "nb.ipynb", SETUP, TRAIN, REPORT)
    hold = work.parent / f"{work.name}-hold"
    hold.mkdir()
    env = {"LOOP_HOLD_DIR": str(hold)}
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    loops = RunStore(str(work / "rd")).cell_records()[1]["loops"]
    assert [(loop["loop"], loop["iterations"]) for loop in loops] == [(0, EPOCHS)]
    args = ["simulate", "--from", "rd", "--duration", "3h", "--hazard", "1", "--json"]
    r = cli(*args, "--trials", "400", cwd=work)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    rows = doc["strategies"]
    assert doc["profile"]["compute_hours"] == pytest.approx(3.0, rel=0.01)
    inside = rows["resume, auto policy"]["cost_ratio"]
    between = rows["resume, between cells only"]["cost_ratio"]
    assert inside <= 1.05, rows
    assert between >= 4.0, rows  # (e^3 - 1) / 3 = 6.4 with no time to a node
    assert rows["restart from scratch"]["cost_ratio"] >= between * 0.95


def test_a_cell_magics_loop_is_left_as_it_is(work: Path) -> None:
    """`%%time` compiles its body again under the same request: that body is not the
    cell's top level, so its loop is no resume point (it was transformed as if it were,
    and a resume could have asked the cell for a loop it does not have); a plain loop in
    the next cell still is."""
    timed = "%%time\nfor i in range(4):\n    x += i\n    print('step', i)"
    write_notebook(work / "nb.ipynb", "x = 0", timed, "for j in range(3):\n    x += j\nprint(x)")
    r = cli("run", "nb.ipynb", "out.ipynb", "--run-dir", "rd", "--snapshot-interval", "0", cwd=work)
    assert r.returncode == 0, r.stderr
    place = Place("local", "rd", str(work / "rd"), {})
    assert _checkpointed(place, 1) == -1
    assert _checkpointed(place, 2) == 3
    cells = load(work / "out.ipynb")["cells"]
    assert "".join(cells[1]["outputs"][0]["text"]).startswith("step 0\nstep 1\nstep 2\nstep 3\n")
    assert "".join(cells[2]["outputs"][0]["text"]) == "9\n"
