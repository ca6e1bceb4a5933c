"""How long one storage operation takes while the object store is down, with the client
libraries' own retries (fsspec's defaults) and with spotbook's store (one request a try,
spotbook's retries the only ones).

    .venv/bin/python bench/bench_outage.py          (~2 min)

moto's S3 server and fake-gcs-server on loopback, behind tests/faultproxy.py with its
outage switch on (every request answered 503). For each store: one try of a read with
the default client, one with spotbook's, and the whole read under spotbook's retries
(RETRY_TRIES tries with backoff) with spotbook's client; requests counted by the proxy.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests import servers  # noqa: E402  (the test servers, started the same way)


def _timed(op: Any) -> float:
    t0 = time.monotonic()
    with contextlib.suppress(Exception):  # the outage: every try fails, as measured
        op()
    return time.monotonic() - t0


def _measure(kind: str, st: servers.Storage) -> tuple[Any, ...]:
    import fsspec

    from spotbook.store import runstore as _store

    os.environ.update(st.direct_env)
    bucket = st.bucket()
    os.environ.update(st.env)
    url = f"{bucket}/x"
    plain = fsspec.filesystem(kind, skip_instance_cache=True)
    plain.pipe_file(url, b"x")
    ours, path = _store._fs(url)
    outage = Path(f"{st.stats_file}.outage")
    outage.write_text("503")
    counts = [int(st.faults()["failed"])]
    times = []
    for op in (
        lambda: plain.cat_file(url),
        lambda: ours.cat_file(path),
        lambda: _store.with_retries(lambda: ours.cat_file(path), f"read {url}"),
    ):
        times.append(_timed(op))
        counts.append(int(st.faults()["failed"]))
    outage.unlink()
    requests = [b - a for a, b in itertools.pairwise(counts)]
    return (kind, *[v for pair in zip(times, requests, strict=True) for v in pair])


def main() -> None:
    from spotbook.store import runstore as _store

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, start in (("s3", servers.start_s3), ("gs", servers.start_gcs)):
            st = start(Path(tmp), {})
            try:
                rows.append(_measure(kind, st))
            finally:
                st.stop()
    print(
        "| store | one try, client's own retries: s (requests) | one try, spotbook's "
        "client: s (requests) | ratio | whole read, spotbook's "
        f"{_store.RETRY_TRIES} tries: s (requests) |"
    )
    print("|---|---:|---:|---:|---:|")
    for kind, tp, np_, to, no, ta, na in rows:
        print(
            f"| {kind} | {tp:.2f} ({np_}) | {to:.2f} ({no}) | {tp / max(to, 0.01):.0f}x "
            f"| {ta:.1f} ({na}) |"
        )


if __name__ == "__main__":
    main()
