"""A seeded mutator of run stores, and the commands that read them, run on each mutant.

``python -m tests.store_fuzz TEMPLATE WORK SEED`` copies the run store ``TEMPLATE`` once
per mutation into ``WORK``, changes one of its objects — a field's type or value, its
size (a sparse file past every read limit), its nesting, its encoding (invalid UTF-8, a
lone surrogate), or the object made a FIFO, a directory, or a link to ``/dev/zero`` —
and runs each reading command on it in this process, under an alarm. It prints one JSON
line per (mutation, command): the exit code, whether a traceback or "internal error"
was printed, whether the alarm rang (a hang). tests/test_store_fuzz.py asserts on them.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import random
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# seconds one command may take before it counts as hung, at least; on a slower machine
# ten times what the control (the unchanged store, run first, given CONTROL_ALARM) took:
# a resume that runs cells on a loaded machine took more than 30 s without hanging
ALARM = 30
CONTROL_ALARM = 600

Mutation = Callable[[Path, random.Random], str | None]  # what it changed, if it says


def _json_field(path: Path, rng: random.Random) -> str | None:
    """One field of a JSON document (or of a line of a JSON Lines file) given a value
    of another type or an odd one; returns the top-level field it is in."""
    text = path.read_text()
    lines = text.splitlines() if path.suffix == ".jsonl" else [text]
    at = rng.randrange(len(lines))
    doc = json.loads(lines[at])
    holder, top = doc, None
    while isinstance(holder, dict) and holder:  # a field of the top or of a nested dict
        key = rng.choice(sorted(holder))
        top = key if top is None else top
        if not isinstance(holder[key], dict) or rng.random() < 0.5:
            break
        holder = holder[key]
    if isinstance(holder, dict) and holder:
        holder[key] = rng.choice(
            [None, [], {}, "x", -1, 10**30, 1e308, True, "\ud800", [[[[1]]]], {"a": {"b": 2}}]
        )
    lines[at] = json.dumps(doc)  # a lone surrogate is written escaped, as JSON allows
    path.write_text("\n".join(lines) + ("\n" if path.suffix == ".jsonl" else ""))
    return top


def _field_named(key: str) -> Mutation:
    """Top-level field ``key`` of a JSON document given a value of another type."""

    def make(path: Path, rng: random.Random) -> None:
        doc = json.loads(path.read_text())
        doc[key] = rng.choice([None, [[1]], {"a": 1}, "x", -1, 1e308, True, "\ud800"])
        path.write_text(json.dumps(doc))

    return make


def _top_type(path: Path, rng: random.Random) -> None:
    path.write_text(rng.choice(["[]", "1", "null", '"run"', "[{}]", "true"]))


def _deep(path: Path, rng: random.Random) -> None:
    depth = rng.choice([1000, 100_000])
    path.write_text("[" * depth + "]" * depth)


def _not_utf8(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    at = rng.randrange(max(len(data), 1))
    path.write_bytes(data[:at] + b"\xff\xfe\xc3" + data[at:])


def _truncated(path: Path, rng: random.Random) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: rng.randrange(max(len(data), 1))])


def _sparse_huge(path: Path, rng: random.Random) -> None:
    """Past every read limit, and costing no disk: a sparse file of 2-3 GiB."""
    with path.open("r+b") as fh:
        fh.truncate(rng.choice([2, 3]) << 30)


def _special(kind: str) -> Mutation:
    def make(path: Path, rng: random.Random) -> None:
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "dir":
            path.mkdir()
            (path / "inside").write_text("{}")
        else:
            os.symlink("/dev/zero", path)

    make.__name__ = f"_{kind}"
    return make


def _none(path: Path, rng: random.Random) -> None:
    """The control: the copy unchanged, which every command reads (exit 0)."""


MUTATIONS: dict[str, Mutation] = {
    "none": _none,
    "field": _json_field,
    "top-type": _top_type,
    "deep": _deep,
    "not-utf8": _not_utf8,
    "truncated": _truncated,
    "sparse-huge": _sparse_huge,
    "fifo": _special("fifo"),
    "dir": _special("dir"),
    "dev-zero": _special("link"),
}
JSON_ONLY = {"field", "top-type", "deep"}


def commands(rd: Path, out: Path) -> list[list[str]]:
    return [
        ["status", str(rd)],
        ["status", str(rd), "--json"],
        ["cost", str(rd), "--json"],
        ["report", str(rd), "-o", str(out / "report.html")],
        ["logs", str(rd)],
        ["resume", str(rd), "--no-progress-bar"],
    ]


class _Hang(BaseException):
    """The alarm rang: a command ran past ALARM seconds."""


def _ring(signum: int, frame: Any) -> None:
    raise _Hang


def run_command(argv: list[str], alarm: int = ALARM) -> dict[str, Any]:
    """``spotbook ARGV`` in this process: exit code, a traceback printed, a hang (past
    ``alarm`` seconds), and the seconds it took."""
    from spotbook.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    logging.root.handlers.clear()  # main() sets up logging to the stderr of its call
    hung = False
    t0 = time.monotonic()
    signal.alarm(alarm)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse
                code = exc.code if isinstance(exc.code, int) else 2
    except _Hang:
        hung, code = True, -1
    finally:
        signal.alarm(0)
    text = err.getvalue()
    return {
        "code": code,
        "hung": hung,
        "seconds": round(time.monotonic() - t0, 3),
        "traceback": "Traceback" in text or "internal error" in text,
        "stderr": text[-600:],
    }


def objects(template: Path) -> list[Path]:
    """The store's objects, by path inside it (the key-holding config is not in it)."""
    return sorted(p.relative_to(template) for p in template.rglob("*") if p.is_file())


def main() -> None:
    """``TEMPLATE WORK SEED [COMMAND...]``: every mutation of every object, each read by
    every command, or by the commands named (``resume`` alone, for a template whose
    resume runs cells)."""
    template, work, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    only = set(sys.argv[4:])
    signal.signal(signal.SIGALRM, _ring)
    rng = random.Random(seed)
    took: dict[str, float] = {}  # each command's time on the control
    for n, (rel, name, mutate) in enumerate(_cases(template), 1):
        case = work / f"case{n}"
        rd = case / "rd"
        shutil.copytree(template, rd, symlinks=True)
        os.chmod(case, 0o700)
        changed = mutate(rd / rel, rng)
        # a random field is named by the top-level field it is in, as "field spec" is:
        # run.json's status, message, attempt and time are outside the seal
        named = f"{name} {changed}" if name == "field" and changed else name
        for argv in commands(rd, case):
            if only and argv[0] not in only:
                continue
            if name == "none":  # the control, first: its time sets the others' alarm
                row = run_command(argv, CONTROL_ALARM)
                took[argv[0]] = float(row["seconds"])
            else:
                row = run_command(argv, max(ALARM, math.ceil(10 * took.get(argv[0], 0.0))))
            print(json.dumps({"object": str(rel), "mutation": named, "argv": argv[0:1], **row}))
            sys.stdout.flush()
        shutil.rmtree(case, ignore_errors=True)


def _cases(template: Path) -> Any:
    """(object, mutation name, mutation) of every case, the control first."""
    n = 0
    for rel in objects(template):
        is_json = rel.suffix in (".json", ".jsonl")
        cases = [(name, m) for name, m in MUTATIONS.items() if is_json or name not in JSON_ONLY]
        if n:  # the control once, on the first object
            cases = [(name, m) for name, m in cases if name != "none"]
        if str(rel) == "run.json":  # every field, sealed or not
            keys = sorted(json.loads((template / rel).read_text()))
            cases += [(f"field {key}", _field_named(key)) for key in keys]
        for name, mutate in cases:
            n += 1
            yield rel, name, mutate


if __name__ == "__main__":
    main()
