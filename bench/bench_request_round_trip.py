"""What a request of its own costs a staged snapshot's pause: one silent execute request
to an idle ipykernel and its reply, with nothing to do, in one run.

Before 5fe922f a staged snapshot was asked for in a silent execute request of its own
after the cell's reply; now, where it is sure to be due, it rides on the cell's request
as a user expression. This bench times that saved round trip on a real kernel: the
request sent, the kernel evaluating a user expression that reads the clock (the way there)
and the reply read back (the way back). Both clocks are the same machine's.

    .venv/bin/python bench/bench_request_round_trip.py [--reps 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

from jupyter_client.manager import start_new_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        kc.execute_interactive("import time", timeout=60)
        there: list[float] = []
        back: list[float] = []
        for _ in range(args.reps + 10):  # the first ten warm the kernel up, not counted
            t0 = time.time()
            msg_id = kc.execute("", silent=True, user_expressions={"t": "time.time()"})
            reply = kc.get_shell_msg(timeout=60)
            t2 = time.time()
            assert reply["parent_header"]["msg_id"] == msg_id
            t1 = float(reply["content"]["user_expressions"]["t"]["data"]["text/plain"])
            there.append(t1 - t0)
            back.append(t2 - t1)
        there, back = there[10:], back[10:]
        total = [a + b for a, b in zip(there, back, strict=True)]
        print(f"{args.reps} silent execute requests to an idle ipykernel, median ms:")
        print(f"  round trip         {statistics.median(total) * 1e3:6.2f}")
        print(f"  to the expression  {statistics.median(there) * 1e3:6.2f}")
        print(f"  back to the runner {statistics.median(back) * 1e3:6.2f}")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
