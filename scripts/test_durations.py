"""Write tests/durations.json, what each test took, from a pytest log with `--durations=0`.

tests/conftest.py orders the suite by it, the longest tests first (so the pytest-xdist
workers end together). Usage, from a CI log or a local run:

    PYTEST_ADDOPTS=--durations=0 bash .ci/run > ci.log 2>&1
    .venv/bin/python scripts/test_durations.py ci.log

Setup, call and teardown add up per test; tests under a second are left out (they count
as short). The figures need not be exact, only their order: a log of a run under load
serves as well as an idle one.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"^(\d+(?:\.\d+)?)s (setup|call|teardown)\s+(\S.*)$")
OUT = Path(__file__).parent.parent / "tests" / "durations.json"


def main(log: str) -> int:
    """Read the log, write the file; 2 when the log has no durations."""
    took: dict[str, float] = {}
    for line in Path(log).read_text(errors="replace").splitlines():
        m = LINE.match(line.strip())
        if m:
            took[m[3]] = took.get(m[3], 0.0) + float(m[1])
    kept = {k: round(v, 1) for k, v in sorted(took.items()) if v >= 1.0}
    if not kept:
        print(f"no durations in {log} (run pytest with --durations=0)", file=sys.stderr)
        return 2
    OUT.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
    print(f"{OUT}: {len(kept)} tests of {len(took)}, {sum(kept.values()):.0f} s in all")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
