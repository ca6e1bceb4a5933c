"""The node-loss pattern table: each pattern of tests/node_patterns.py (files and
environment changes a notebook makes and reads back), killed at the notebook's gate and
resumed on the same disk, and on a wiped node (working directory, home, temporary
directory and pip target emptied), against an uninterrupted run.

    .venv/bin/python bench/node_patterns_table.py [--modes every-cell,auto,off]

Run it against another checkout's spotbook with ``PYTHONPATH=OTHER/src`` (the kernel
inherits it), e.g. the code before the node-loss work, to get the "before" column.
Prints a markdown table: identical, or what the pattern printed instead (``missing`` when
the run failed before printing it), and the resume's exit code per case.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests import node_patterns as npat  # noqa: E402


class Node:
    def __init__(self, root: Path, wheel: Path, url: str) -> None:
        self.root, self.wheel, self.url = root, wheel, url
        self.gate = root.parent / f"{root.name}-gate"

    def env(self) -> dict[str, str]:
        site = self.root / "site"
        return {
            **os.environ,
            "HOME": str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "PIP_TARGET": str(site),
            "PYTHONPATH": os.pathsep.join(
                p for p in (os.environ.get("PYTHONPATH"), str(site)) if p
            ),
            "PIP_NO_INDEX": "1",
            "NL_WHEEL": str(self.wheel),
            "NL_URL": self.url,
            "NL_GATE": str(self.gate),
            "MPLCONFIGDIR": str(self.root.parent / "mpl"),
            # the run key is not on the node (a Secret, a key file of the user's)
            "SPOTBOOK_CONFIG_DIR": str(self.root.parent.parent / "config"),
        }

    def make(self) -> Node:
        for name in ("work", "home", "tmp", "site"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        npat.write(self.root / "work" / "nl.ipynb")
        return self

    def wipe(self) -> None:
        for name in ("work", "home", "tmp", "site"):
            shutil.rmtree(self.root / name)
        self.make()


def _spotbook(*args: str, node: Node) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "spotbook", *args],
        cwd=node.root / "work",
        env=node.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _records(rd: Path) -> int:
    cells = rd / "cells"
    if not cells.is_dir():
        return 0
    lines = [
        line
        for n in os.listdir(cells)
        if n.endswith(".jsonl")
        for line in (cells / n).read_bytes().split(b"\n")[:-1]
    ]
    return sum(1 for line in lines if b'"status":"executed"' not in line)


def case(top: Path, name: str, mode: str, wipe: bool, wheel: Path, url: str) -> tuple:
    node = Node(top / name / "node", wheel, url).make()
    rd = top / name / "store"
    extra = ["--snapshot-interval", "1"] if mode == "auto" else []
    proc = _spotbook(
        "run", "nl.ipynb", "out.ipynb", "--run-dir", str(rd), "--snapshot", mode, *extra,
        node=node,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while _records(rd) < npat.GATE:
        if proc.poll() is not None or time.monotonic() > deadline:
            return {}, f"run ended ({proc.returncode})"
        time.sleep(0.05)  # a poll: the gate cell's records are the event
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if wipe:
        node.wipe()
    node.gate.touch()
    code = _spotbook("resume", str(rd), node=node).wait()
    out = node.root / "work" / "out.ipynb"
    import json

    got = npat.patterns(json.loads(out.read_text())) if out.exists() else {}
    return got, f"exit {code}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default="every-cell,auto,off")
    args = ap.parse_args()
    import functools
    import http.server
    import threading

    top = Path(tempfile.mkdtemp(prefix="nl-table-"))
    served = top / "served"
    served.mkdir()
    (served / "data.txt").write_text("downloaded bytes")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/data.txt"
    try:
        wheel = npat.build_wheel(top)
        ref = Node(top / "ref" / "node", wheel, url).make()
        ref.gate.touch()
        subprocess.run(
            [sys.executable, "-m", "spotbook", "run", "nl.ipynb", "ref.ipynb",
             "--run-dir", str(top / "ref" / "store")],
            cwd=ref.root / "work", env=ref.env(), check=True, capture_output=True,
        )  # fmt: skip
        import json

        want = npat.patterns(json.loads((ref.root / "work" / "ref.ipynb").read_text()))
        cases = [("same disk, every-cell", "every-cell", False)]
        cases += [(f"new node, {m}", m, True) for m in args.modes.split(",")]
        results = {
            label: case(top, f"c{i}", mode, wipe, wheel, url)
            for i, (label, mode, wipe) in enumerate(cases)
        }
        print("| pattern | " + " | ".join(label for label, _, _ in cases) + " |")
        print("|---|" + "---|" * len(cases))
        for pattern, value in want.items():
            cells = []
            for label, _, _ in cases:
                got = results[label][0]
                if got.get(pattern) == value:
                    cells.append("identical")
                else:
                    cells.append("missing" if pattern not in got else "**differs**")
            print(f"| {pattern} | " + " | ".join(cells) + " |")
        print("| (resume) | " + " | ".join(results[label][1] for label, _, _ in cases) + " |")
        for label, _, _ in cases:
            same = sum(1 for p, v in want.items() if results[label][0].get(p) == v)
            print(f"{label}: {same}/{len(want)} identical ({results[label][1]})")
    finally:
        server.shutdown()
        shutil.rmtree(top, ignore_errors=True)


if __name__ == "__main__":
    main()
