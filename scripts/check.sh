#!/usr/bin/env bash
# Every check, as developers and CI run it: lint, format, types, the whole test suite.
set -euo pipefail
. "$(dirname "$0")/_venv.sh" "[test,demo]"
echo "== ruff"; ruff check src tests bench; ruff format --check src tests bench
echo "== mypy"; mypy
echo "== pytest"; python -m pytest "$@"
