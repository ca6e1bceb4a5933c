"""Run papermill's own tests with spotbook in papermill's place; print what passes.

    .venv/bin/python scripts/papermill_suite.py [-v] [--papermill] [--json]

``--papermill`` runs the same tests against papermill itself, unchanged: the baseline
(some of papermill's tests fail with the IPython installed here, whoever runs them).

papermill ships its tests inside its package (papermill/tests). This runs three of
them against spotbook, with papermill's notebooks and assertions unchanged:

- test_execute.py: ``papermill.execute_notebook`` is spotbook's ``execute_notebook``.
- test_inspect.py: ``papermill.inspect_notebook`` is spotbook's.
- test_cli.py: the command-line cases run through spotbook's parser. papermill's
  ``TestCLI`` patches ``papermill.cli.execute_notebook`` and checks the arguments the
  command line hands it; here the same command line is parsed by ``spotbook run``'s
  parser and the result is handed, under papermill's argument names, to that patched
  function. The pipe and stdout-file cases start ``spotbook run`` as a subprocess where
  papermill's start ``python -m papermill``, and ``_resolve_type`` is spotbook's.

Tests that patch papermill's internal classes (its engine's notebook client, its engine
registry) test papermill's insides and cannot pass under another implementation; the
report lists every failure with its first error line so each can be named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

PLUGIN = "_papermill_swap"
FILES = ("test_execute.py", "test_cli.py", "test_inspect.py")


def main() -> int:
    import papermill

    tests = Path(papermill.__file__).parent / "tests"
    verbose = "-v" in sys.argv[1:]
    baseline = "--papermill" in sys.argv[1:]
    who = "papermill" if baseline else "spotbook"
    with tempfile.TemporaryDirectory(prefix="spotbook-papermill-suite-") as tmp:
        (Path(tmp) / "pytest.ini").write_text("[pytest]\n")
        report = Path(tmp) / "report.xml"
        # pytest spells assertion messages differently under CI (no truncation): the
        # report must read the same wherever it runs
        env = {
            **{k: v for k, v in os.environ.items() if k not in ("CI", "BUILD_NUMBER")},
            "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
            ),
            "SPOTBOOK_CACHE_DIR": str(Path(tmp) / "cache"),
        }
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(Path(tmp) / "pytest.ini"),
            "--rootdir",
            tmp,
            *(() if baseline else ("-p", PLUGIN)),
            "-p",
            "no:cacheprovider",
            "-q",
            f"--junitxml={report}",
            "-o",
            "junit_family=xunit1",
            *(str(tests / f) for f in FILES),
        ]
        done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if verbose:
            print(done.stdout, done.stderr[-4000:])
        if not report.exists():
            print(done.stdout, done.stderr, file=sys.stderr)
            return 2
        cases = ET.parse(report).getroot().iter("testcase")
        results: dict[str, list[tuple[str, str | None]]] = {f: [] for f in FILES}
        for case in cases:
            file = os.path.basename(case.get("file") or "")
            if file not in results:
                continue
            cls = (case.get("classname") or "").rsplit(".", 1)[-1]
            name = case.get("name", "")
            if cls and not cls.startswith("test_"):
                name = f"{cls}.{name}"
            bad = case.find("failure")
            if bad is None:
                bad = case.find("error")
            why = None if bad is None else (bad.get("message") or "").splitlines()[0][:150]
            results[file].append((name, why))
    if "--json" in sys.argv[1:]:
        doc = {f: {name: why for name, why in got} for f, got in results.items()}
        print(json.dumps(doc, indent=1))
        return 0
    total_pass = total = 0
    for file, got in results.items():
        ok = sum(1 for _, why in got if why is None)
        total_pass, total = total_pass + ok, total + len(got)
        print(f"{file}: {ok} of {len(got)} pass under {who}")
        for name, why in got:
            if why is not None:
                print(f"  FAIL {name}: {why}")
    print(f"all: {total_pass} of {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
