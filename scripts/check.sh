#!/usr/bin/env bash
# Every check, as developers and CI run it: lint, format, types, the whole test suite.
set -euo pipefail
echo "== setup ($(date +%T))"
. "$(dirname "$0")/_venv.sh" "[test,demo]"
# Azurite (Azure's blob storage emulator, from npm) for the az:// tests
if [ ! -x .cache/node/node_modules/.bin/azurite-blob ]; then
  if ! command -v npm >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  fi
  npm install --prefix .cache/node --silent --no-audit --no-fund azurite@3 >/dev/null
fi
echo "== ruff ($(date +%T))"; ruff check src tests bench; ruff format --check src tests bench
echo "== mypy"; mypy
echo "== pytest ($(date +%T))"; python -m pytest "$@"
