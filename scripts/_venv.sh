# Sourced by the other scripts: make .venv (Python >= 3.11) and install spotbook into it.
# Usage: . scripts/_venv.sh [extras | --create-only]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3 python3.11 python3.12 python3.13; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      PY=$cand; break
    fi
  done
fi
if [ -z "$PY" ]; then
  echo "spotbook needs Python 3.11 or newer on PATH (or set PYTHON=/path/to/python3)" >&2
  exit 2
fi
if [ ! -x .venv/bin/python ]; then
  if ! "$PY" -m venv .venv 2>.venv-error.txt; then
    echo "note: '$PY -m venv' failed: $(tail -n 2 .venv-error.txt)" >&2
    rm -rf .venv
    # Debian ships venv separately; install it when we may, else say what to do.
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
      ver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
      apt-get update -qq && (apt-get install -y -qq "python${ver}-venv" || apt-get install -y -qq python3-venv)
      "$PY" -m venv .venv
    else
      echo "cannot create a virtual environment: install python3-venv (sudo apt-get install python3-venv)" >&2
      exit 2
    fi
  fi
fi
# --create-only: make .venv and stop there (scripts/check.sh, before its other apt
# installs start, as only one apt may run at a time)
if [ "${1:-}" = --create-only ]; then rm -f .venv-error.txt; return 0; fi
# (some machines' pip configs warn about absent local indexes: not ours, hidden)
quiet() { grep -v "^WARNING: Location" || true; }
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | quiet
.venv/bin/python -m pip install -q -e ".${1:-}" 2>&1 | quiet
.venv/bin/python -c "import spotbook" || { echo "installing spotbook failed (see above)" >&2; exit 2; }
# Bytecode for the sources the editable install runs from (pip compiles what it installs,
# not these): where PYTHONDONTWRITEBYTECODE is set, every start would compile them again
.venv/bin/python -m compileall -q src >/dev/null || true
rm -f .venv-error.txt
export PATH="$PWD/.venv/bin:$PATH"
