"""What one guess at a run key costs someone who reads a run store, before and after
the derived key (issue 31), and what the derivation adds to a command.

A store holds the key id and sealed objects in the clear. Format 1 sealed with the key
itself: checking a guessed key against the key id is one HMAC. Format 2 seals with a key
derived by scrypt: each guess pays the derivation first. The same guesses are timed both
ways in one run, then a real command (``spotbook status`` of a sealed run) is timed to
show what one derivation per process adds.

    .venv/bin/python bench/bench_key_guess.py      # ~30 s
"""

from __future__ import annotations

import hashlib
import hmac
import os
import statistics
import subprocess
import sys
import tempfile
import time

from spotbook.store.integrity import Key, derive_key

GUESSES_HMAC = 200_000
GUESSES_KDF = 40


def per_guess(fmt: int, n: int) -> float:
    """Seconds per guessed key, checked against a recorded key id of ``fmt``."""
    target = Key(os.urandom(32).hex().encode(), "bench").id_for(fmt)
    t0 = time.perf_counter()
    for i in range(n):
        guess = b"guess-%032d" % i
        mac_key = guess if fmt == 1 else derive_key(guess)
        found = hmac.new(mac_key, b"spotbook key id", hashlib.sha256).hexdigest()[:16]
        assert found != target
    return (time.perf_counter() - t0) / n


def command_seconds(env: dict[str, str], run_dir: str, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "spotbook", "status", run_dir],
                       env=env, capture_output=True, check=True)  # fmt: skip
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    one = per_guess(1, GUESSES_HMAC)
    two = per_guess(2, GUESSES_KDF)
    t0 = time.perf_counter()
    derive_key(os.urandom(32))
    derive = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SPOTBOOK_CONFIG_DIR": os.path.join(tmp, "cfg")}
        nb = os.path.join(tmp, "one.ipynb")
        with open(nb, "w") as fh:
            fh.write('{"cells":[{"cell_type":"code","metadata":{},"source":"x = 1",'
                     '"outputs":[],"execution_count":null}],"metadata":{"kernelspec":'
                     '{"name":"python3","display_name":"Python 3","language":"python"}},'
                     '"nbformat":4,"nbformat_minor":5}')  # fmt: skip
        run_dir = os.path.join(tmp, "run")
        subprocess.run([sys.executable, "-m", "spotbook", "run", nb, "--run-dir", run_dir,
                        "--no-progress-bar"], env=env, capture_output=True, check=True)  # fmt: skip
        status = command_seconds(env, run_dir)
    print("| | format 1 (the key itself) | format 2 (scrypt-derived) | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| seconds per guessed key, one core | {one:.2e} | {two:.2e} | {two / one:,.0f}x |")
    print(f"| guesses per second, one core | {1 / one:,.0f} | {1 / two:,.1f} | |")
    print(f"\none derivation in this process: {derive * 1000:.1f} ms")
    print(f"`spotbook status RUN`, median of 5 (one derivation included): {status:.3f} s")


if __name__ == "__main__":
    main()
