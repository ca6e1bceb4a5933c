"""Each capture/restore pair of the process-state registry, against the real library:
capture, change everything, restore, and find it as it was. (The end-to-end check, in
a killed and resumed kernel, is tests/test_fidelity.py.)"""

from __future__ import annotations

import decimal
import logging
import os
import random
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from spotbook.kernel import process_state as ps


@pytest.fixture
def saved() -> Iterator[None]:
    """Leave this test process as it was."""
    cwd, path, env = os.getcwd(), list(sys.path), dict(os.environ)
    rng = random.getstate()
    limit = sys.getrecursionlimit()
    ctx = decimal.getcontext().copy()
    with warnings.catch_warnings():
        yield
    os.chdir(cwd)
    sys.path[:] = path
    os.environ.clear()
    os.environ.update(env)
    random.setstate(rng)
    sys.setrecursionlimit(limit)
    decimal.setcontext(ctx)


def _observe() -> dict[str, Any]:
    import matplotlib
    import numpy as np
    import pandas as pd

    return {
        "cwd": os.getcwd(),
        "path": list(sys.path),
        "env": (os.environ.get("PS_SET"), os.environ.get("PS_DROP")),
        "random": random.random(),
        "np.random": float(np.random.rand()),
        "np print": np.get_printoptions()["precision"],
        "np err": np.geterr()["divide"],
        "pandas": pd.get_option("display.max_rows"),
        "rc": matplotlib.rcParams["lines.linewidth"],
        "warnings": list(warnings.filters[:3]),
        "decimal": decimal.getcontext().prec,
        "recursion": sys.getrecursionlimit(),
        "logger": (logging.getLogger("ps.test").level, len(logging.getLogger("ps.test").handlers)),
    }


def test_every_part_comes_back_as_it_was(saved: None, tmp_path: Any) -> None:
    import matplotlib
    import numpy as np
    import pandas as pd

    os.environ["PS_DROP"] = "x"
    ps.set_baseline()
    # the notebook's changes
    os.chdir(tmp_path)
    sys.path.insert(0, str(tmp_path))
    os.environ["PS_SET"] = "1"
    del os.environ["PS_DROP"]
    random.seed(1)
    np.random.seed(2)
    np.set_printoptions(precision=3)
    np.seterr(divide="ignore")
    pd.set_option("display.max_rows", 7)
    matplotlib.rcParams["lines.linewidth"] = 4.0
    warnings.simplefilter("ignore", UserWarning)
    decimal.getcontext().prec = 5
    sys.setrecursionlimit(2500)
    logging.getLogger("ps.test").setLevel(logging.DEBUG)
    logging.getLogger("ps.test").addHandler(logging.NullHandler())
    state, failed = ps.capture()
    assert not failed
    env = {k: state.pop(k) for k in ("cwd", "sys.path", "os.environ")}
    assert state.keys() >= {"random", "numpy.random", "pandas options", "matplotlib rcParams"}
    want = _observe()
    ps.restore({**state, **env}, ps.ENV)  # put the generators back after observing
    ps.restore(state, ps.LAST)
    # a fresh kernel's: everything different
    os.chdir("/")
    sys.path.pop(0)
    os.environ.pop("PS_SET")
    os.environ["PS_DROP"] = "x"
    random.seed(9)
    np.random.seed(9)
    np.set_printoptions(precision=8)
    np.seterr(divide="warn")
    pd.reset_option("display.max_rows")
    matplotlib.rcParams["lines.linewidth"] = 1.0
    warnings.resetwarnings()
    decimal.getcontext().prec = 28
    sys.setrecursionlimit(1000)
    logging.getLogger("ps.test").setLevel(logging.NOTSET)
    logging.getLogger("ps.test").handlers.clear()
    assert _observe() != want
    for stage in (ps.ENV, ps.CONFIG, ps.LAST):
        assert ps.restore({**state, **env}, stage) == {}
    assert _observe() == want
    np.set_printoptions(precision=8)
    np.seterr(divide="warn")
    pd.reset_option("display.max_rows")
    matplotlib.rcParams["lines.linewidth"] = 1.5


def test_a_cells_generators_are_recorded_only_when_it_draws() -> None:
    import numpy as np
    import numpy.random  # numpy 2 loads it on first use: here, before the first reading

    before = ps.rng_states()
    assert "numpy.random" in before
    assert ps.same_rngs(before, ps.rng_states())
    np.random.rand()
    after = ps.rng_states()
    assert not ps.same_rngs(before, after)
    saved_json = ps.rngs_json(before)
    assert ps.restore_rngs(saved_json) == {}
    assert ps.same_rngs(before, ps.rng_states())


def test_a_part_for_another_library_is_one_registration() -> None:
    box = {"v": 1}
    ps.register(ps.Part("demo", ps.CONFIG, lambda: box["v"], lambda v: box.update(v=v)))
    try:
        state, _ = ps.capture()
        box["v"] = 2
        ps.restore(state, ps.CONFIG)
        assert box["v"] == 1
    finally:
        ps.PARTS[:] = [p for p in ps.PARTS if p.name != "demo"]
