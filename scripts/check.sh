#!/usr/bin/env bash
# Every check, as developers and CI run it: lint, format, types, the whole test suite.
set -euo pipefail
echo "== setup ($(date +%T))"
cd "$(dirname "$0")/.."
# The setup's independent steps run side by side (each waits mostly on downloads and
# unpacking, one core each): a step started with `step NAME CMD` logs to .cache/setup/NAME.log;
# `finish NAME` waits for it, shows what it said and stops here if it failed.
mkdir -p .cache/setup
declare -A steps=()
step() { local name=$1; shift; ("$@") >".cache/setup/$name.log" 2>&1 & steps[$name]=$!; }
finish() {
  local name=$1 rc=0
  wait "${steps[$name]}" || rc=$?
  grep -v "^WARNING: Location" ".cache/setup/$name.log" || true
  if [ "$rc" != 0 ]; then echo "setup step '$name' failed (exit $rc): see above" >&2; exit 2; fi
}
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
. scripts/_venv.sh --create-only  # (which may install python3-venv with apt itself)
# The other Debian packages, in one apt call: npm for Azurite,
# podman, runc and debootstrap for the container tests (tests/test_podman.py: rootful, where
# this script runs as root on a Debian-like machine; elsewhere those tests say why they do
# not run), Chromium for the dashboard's browser tests (tests/test_view.py; Playwright
# drives it, and never downloads a browser of its own)
debs=()
if [ ! -x .cache/node/node_modules/.bin/azurite-blob ] && ! command -v npm >/dev/null 2>&1; then
  debs+=(nodejs npm)
fi
if ! command -v podman >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  debs+=(podman runc debootstrap)
fi
command -v chromium >/dev/null 2>&1 || debs+=(chromium)
apt_install() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
if [ "${#debs[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    step apt apt_install "${debs[@]}"
  else
    echo "note: not installing ${debs[*]} (needs root and apt-get): the tests that need them say so"
  fi
fi
# Airflow, in a venv of its own (its pins are not the suite's), with spotbook installed
# in it: Airflow's PapermillOperator drives spotbook's papermill engine (tests/test_airflow.py).
# Started first: it is the setup's longest step, beside the suite's own install
airflow_venv() {
  if [ -x .cache/airflow-venv/bin/airflow ]; then return; fi
  .venv/bin/python -m venv .cache/airflow-venv
  .cache/airflow-venv/bin/python -m pip install -q "apache-airflow==3.3.2" \
    "apache-airflow-providers-papermill==3.13.3" -e ".[papermill]"
}
step airflow airflow_venv
. scripts/_venv.sh "[test,demo]"
# torch, for the resume tests of torch state and training loops (tests/test_in_cell.py,
# the object-class table): its CPU build where a wheel of it lies on this machine, else
# the package index's build (CUDA's, some GB, which runs on the CPU too); pip's cache
# keeps it for the next run on the same machine
torch_cpu() {
  if python -c "import torch" 2>/dev/null; then return; fi
  if python -m pip install -q --dry-run --no-index --no-deps torch==2.13.0 >/dev/null 2>&1; then
    python -m pip install -q torch==2.13.0
  else
    python -m pip install -q torch
  fi
}
step torch torch_cpu
if [ -n "${steps[apt]:-}" ]; then finish apt; fi
# Azurite (Azure's blob storage emulator, from npm) for the az:// tests
azurite() {
  if [ -x .cache/node/node_modules/.bin/azurite-blob ]; then return; fi
  npm install --prefix .cache/node --silent --no-audit --no-fund azurite@3 >/dev/null
}
step azurite azurite
# The container tests' base and image, built while the rest of the setup, the linters and
# the first tests run; their fixture waits for this build (tests/container_image.py)
step image python -m tests.container_image
echo "== ruff ($(date +%T))"; ruff check src tests bench; ruff format --check src tests bench
echo "== mypy"; mypy
echo "== import contracts"; lint-imports --no-cache
finish torch
finish airflow
finish azurite
# The tests on several workers (pytest-xdist): most of a test's time is a kernel starting
# or a run waiting on its kernel, which overlap well on 2 cores. Files whose tests must
# share one worker are named in tests/conftest.py (ONE_WORKER: the container image is
# built once).
echo "== pytest ($(date +%T))"
rc=0
python -m pytest -n "${SPOTBOOK_TEST_WORKERS:-4}" "$@" || rc=$?
# what the background image build said (its failures the container tests report themselves)
if ! kill -0 "${steps[image]}" 2>/dev/null; then cat .cache/setup/image.log; fi
exit "$rc"
