#!/usr/bin/env bash
# The demo: run a real notebook locally, kill it with SIGKILL part-way, resume it.
# The resumed run continues after its last finished cell with the kernel's variables
# restored, instead of starting over.
set -euo pipefail
. "$(dirname "$0")/_venv.sh" "[demo]"
RUN=.spotbook/demo
rm -rf "$RUN" demo-output.ipynb
echo "== 1. start: spotbook run examples/train.ipynb demo-output.ipynb -p epochs 6 --run-dir $RUN --snapshot every-cell"
spotbook run examples/train.ipynb demo-output.ipynb -p epochs 6 --run-dir "$RUN" --snapshot every-cell &
pid=$!
# wait until four cells (data, model, two epochs) are committed, then pull the plug
for _ in $(seq 1 600); do
  n=$( (cat "$RUN"/cells/*.jsonl 2>/dev/null || true) | wc -l)
  [ "$n" -ge 5 ] && break
  sleep 0.1
done
echo "== 2. kill -9 $pid after $(cat "$RUN"/cells/*.jsonl | wc -l) committed cells (the node is gone)"
kill -9 "$pid"; wait "$pid" 2>/dev/null || true
spotbook status "$RUN"
echo "== 3. spotbook resume $RUN"
spotbook resume "$RUN"
echo "== 4. where it stands"
spotbook status "$RUN"
python - <<'PY'
import json
nb = json.load(open("demo-output.ipynb"))
print("last cell says:", "".join(nb["cells"][-1]["outputs"][0]["text"]).strip())
PY
echo "The output notebook is demo-output.ipynb; the run store is $RUN."
echo "spotbook is in .venv/bin: run '. .venv/bin/activate' to put it on your PATH (or 'pipx install .' here)."
