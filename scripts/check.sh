#!/usr/bin/env bash
# Every check, as developers and CI run it: lint, format, types, the whole test suite.
set -euo pipefail
echo "== setup ($(date +%T))"
. "$(dirname "$0")/_venv.sh" "[test,demo]"
# torch's CPU build, where a wheel of it lies on this machine (a plain `pip install
# torch` would fetch a CUDA build of several GB): the resume tests then cover torch too
if ! python -c "import torch" 2>/dev/null; then
  if python -m pip install -q --dry-run --no-index --no-deps torch==2.13.0 >/dev/null 2>&1; then
    python -m pip install -q torch==2.13.0 2>&1 | quiet
  else
    echo "note: no local torch wheel; the object-class table runs without torch"
  fi
fi
# Airflow, in a venv of its own (its pins are not the suite's), with spotbook installed
# in it: Airflow's PapermillOperator drives spotbook's papermill engine (tests/test_airflow.py)
if [ ! -x .cache/airflow-venv/bin/airflow ]; then
  python -m venv .cache/airflow-venv
  .cache/airflow-venv/bin/python -m pip install -q "apache-airflow==3.3.2" \
    "apache-airflow-providers-papermill==3.13.3" -e ".[papermill]" 2>&1 | quiet
fi
# Azurite (Azure's blob storage emulator, from npm) for the az:// tests
if [ ! -x .cache/node/node_modules/.bin/azurite-blob ]; then
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  fi
  npm install --prefix .cache/node --silent --no-audit --no-fund azurite@3 >/dev/null
fi
# podman, runc and debootstrap for the container tests (tests/test_podman.py): rootful,
# where this script runs as root on a Debian-like machine; elsewhere those tests say why
# they do not run
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq podman runc debootstrap >/dev/null
  else
    echo "note: no podman (needs root and apt-get to install); the container tests skip"
  fi
fi
# Debian's Chromium for the dashboard's browser tests (tests/test_view.py; Playwright drives
# it, and never downloads a browser of its own)
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "note: no chromium (needs root and apt-get to install); the browser test skips"
  fi
fi
echo "== ruff ($(date +%T))"; ruff check src tests bench; ruff format --check src tests bench
echo "== mypy"; mypy
echo "== import contracts"; lint-imports --no-cache
# The tests on several workers (pytest-xdist): most of a test's time is a kernel starting
# or a run waiting on its kernel, which overlap well on 2 cores. Files whose tests must
# share one worker are named in tests/conftest.py (ONE_WORKER: the container image is
# built once).
echo "== pytest ($(date +%T))"
python -m pytest -n "${SPOTBOOK_TEST_WORKERS:-4}" "$@"
