#!/usr/bin/env bash
# The checks that need a GPU, opt-in everywhere else, as one short run for a machine that
# has one: the gpu-marked tests, then the pause of a snapshot of CUDA tensors against a
# plain tensor.cpu() of the same tensors (bench/bench_snapshot_pause.py --kernels cuda).
#
#   scripts/gpu_checks.sh LOGDIR [BEFORE]
#
# $PYTHON (python3 unless set; .venv/bin/python in a checkout set up by scripts/check.sh)
# must have torch with CUDA, and spotbook's dependencies importable (PYTHONPATH
# may name a folder they were installed into with pip --target; JUPYTER_PATH its
# share/jupyter, where ipykernel's kernelspec lies). BEFORE: the commit, or a src/ folder
# archived beforehand (a copy without history), that the bench compares with (HEAD~1).
# LOGDIR gets gpu.txt, tests.log and bench.log.
set -uo pipefail
logs=${1:?usage: scripts/gpu_checks.sh LOGDIR [BEFORE]}
before=${2:-HEAD~1}
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."
mkdir -p "$logs"
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD/src"
{ nvidia-smi -L; "$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))'; } 2>&1 | tee "$logs/gpu.txt"
# the modules with gpu-marked tests (the others import packages such a machine may lack);
# -W default: a warning from another version of a library is reported, not made an error
mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
timeout "${GPU_TESTS_TIMEOUT:-300}" "$py" -m pytest -p no:cacheprovider -W default -ra -q \
  -m gpu --durations=10 "${files[@]}" 2>&1 | tee "$logs/tests.log"
tests=${PIPESTATUS[0]}
timeout "${GPU_BENCH_TIMEOUT:-240}" "$py" bench/bench_snapshot_pause.py --sizes 0.1,1,4 \
  --kernels cuda --before "$before" --no-overhead 2>&1 | tee "$logs/bench.log"
bench=${PIPESTATUS[0]}
echo "gpu tests rc=$tests, bench rc=$bench" | tee -a "$logs/gpu.txt"
exit $((tests || bench))
