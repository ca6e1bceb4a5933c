#!/usr/bin/env bash
# Run a command while busy loops take about half of every core (one loop per core, at the
# same priority): the suite must pass as it does on an idle machine (no test's outcome may
# depend on how fast the machine is). Usage: scripts/under_load.sh bash .ci/run
set -euo pipefail
loops=()
for _ in $(seq "$(nproc)"); do
  python3 -c 'while True: pass' &
  loops+=($!)
done
trap 'kill "${loops[@]}" 2>/dev/null || true' EXIT
echo "== under load: ${#loops[@]} busy loops ($(nproc) cores)"
"$@"
