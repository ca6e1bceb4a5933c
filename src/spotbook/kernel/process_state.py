"""Process state outside the notebook's variables: one capture/restore pair per part.

A notebook observes more than its variables: the working directory, ``sys.path``,
the environment, the global random generators, library options, IPython's own
settings. Each :class:`Part` captures one of them with every snapshot and puts it
back on resume. A part tied to a library is active only when the notebook has
imported that library (spotbook never imports one to look at it).

Parts restore in three stages, because their order matters:

- ``ENV``: before the notebook's modules are imported again (imports read the cwd,
  ``sys.path`` and environment variables);
- ``CONFIG``: after those imports, before the variables (library options);
- ``LAST``: after the variables and every replay (random generators, which a
  replayed cell would otherwise advance).

To support another library, add a :class:`Part` to :data:`PARTS` (or call
:func:`register`): a capture that returns something picklable, a restore that
puts it back, and the module whose presence activates it.
"""

from __future__ import annotations

import contextlib
import copy
import decimal
import logging
import os
import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV, CONFIG, LAST = 0, 1, 2
# Environment variables the runner sets for each attempt: never the notebook's state.
_RUNNER_ENV = ("SPOTBOOK_", "JPY_", "KERNEL_LAUNCH")


@dataclass(frozen=True)
class Part:
    """One piece of process state: how to capture it and how to put it back."""

    name: str
    stage: int
    capture: Callable[[], Any]
    restore: Callable[[Any], None]
    module: str | None = None  # active only once this module is imported


PARTS: list[Part] = []


def register(part: Part) -> None:
    """Add (or replace) a part of the registry."""
    PARTS[:] = [p for p in PARTS if p.name != part.name] + [part]


def active() -> list[Part]:
    """The parts of process state that apply: their library is imported."""
    return [p for p in PARTS if p.module is None or p.module in sys.modules]


# -- the interpreter -------------------------------------------------------------------
_baseline_env: dict[str, str] = {}
_baseline_raw: Any = None
_baseline_loggers: dict[str, tuple[Any, ...]] = {}


def set_baseline() -> None:
    """Remember the environment and loggers the kernel started with: what the notebook
    changed since is what is saved (the kernel's own loggers are not the notebook's)."""
    global _baseline_raw
    _baseline_env.clear()
    _baseline_env.update(os.environ)
    raw = getattr(os.environ, "_data", None)
    _baseline_raw = dict(raw) if isinstance(raw, dict) else None
    _baseline_loggers.clear()
    _baseline_loggers.update({n: _logger_state(lg) for n, lg in _loggers().items()})


def _ours(key: str) -> bool:
    return key.startswith(_RUNNER_ENV)


def _env_capture() -> Any:
    # os.environ decodes every key and value on each look; its raw bytes dict (POSIX)
    # is compared instead, and only what changed is decoded
    raw = getattr(os.environ, "_data", None)
    if isinstance(raw, dict) and isinstance(_baseline_raw, dict):
        decode = os.fsdecode
        changed = {decode(k): decode(v) for k, v in raw.items() if _baseline_raw.get(k) != v}
        removed = [decode(k) for k in _baseline_raw if k not in raw]
    else:
        now = os.environ
        changed = {k: v for k, v in now.items() if _baseline_env.get(k) != v}
        removed = [k for k in _baseline_env if k not in now]
    return {
        "set": {k: v for k, v in changed.items() if not _ours(k)},
        "unset": sorted(k for k in removed if not _ours(k)),
    }


def _env_restore(state: Any) -> None:
    for key in state["unset"]:
        os.environ.pop(key, None)
    os.environ.update(state["set"])


def _path_restore(state: Any) -> None:
    sys.path[:] = state


def _warnings_restore(state: Any) -> None:
    filters: list[Any] = warnings.filters  # type: ignore[assignment]
    if filters != state:
        filters[:] = state
        warnings._filters_mutated()  # type: ignore[attr-defined]


def _loggers() -> dict[str, logging.Logger]:
    found = {
        name: obj
        for name, obj in logging.Logger.manager.loggerDict.items()
        if isinstance(obj, logging.Logger)
    }
    found[""] = logging.getLogger()
    return found


def _logger_state(logger: logging.Logger) -> tuple[Any, ...]:
    return (logger.level, logger.propagate, logger.disabled, list(logger.handlers))


def _logging_capture() -> Any:
    loggers = {}
    for name, logger in _loggers().items():
        state = _logger_state(logger)
        if _baseline_loggers.get(name) != state:
            loggers[name] = state
    return {"disable": logging.root.manager.disable, "loggers": loggers}


def _logging_restore(state: Any) -> None:
    logging.disable(state["disable"])
    for name, (level, propagate, disabled, handlers) in state["loggers"].items():
        logger = logging.getLogger(name or None)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.disabled = disabled
        logger.handlers[:] = handlers


# -- libraries ---------------------------------------------------------------------------
def _numpy() -> Any:
    return sys.modules["numpy"]


def _np_options_capture() -> Any:
    np = _numpy()
    return {"print": np.get_printoptions(), "err": np.geterr()}


def _np_options_restore(state: Any) -> None:
    np = _numpy()
    printing = dict(state["print"])
    legacy = printing.pop("legacy", False)
    np.set_printoptions(**printing, legacy=legacy if legacy else False)
    np.seterr(**state["err"])


def _np_random_restore(state: Any) -> None:
    _numpy().random.set_state(state)


def _pandas_config() -> Any:
    return sys.modules["pandas"]._config.config


def _pandas_capture() -> Any:
    # the nested dict of every option's value: copying it is far cheaper than asking
    # each registered option in turn (values are scalars, callables or tuples)
    return _copy_tree(_pandas_config()._global_config)


def _copy_tree(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy_tree(v) if type(v) is dict else v for k, v in tree.items()}


def _pandas_restore(state: Any) -> None:
    config = _pandas_config()
    current = _flatten(config._global_config)
    for key, value in _flatten(state).items():
        if key in current and current[key] is not value and current[key] != value:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # options pandas deprecated since
                config.set_option(key, value)


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _mpl_capture() -> Any:
    mpl = sys.modules["matplotlib"]
    # raw values through dict's own items: RcParams' mapping methods validate each
    # key and cost a hundred times more
    return dict(dict.items(mpl.rcParams))


def _mpl_restore(state: Any) -> None:
    mpl = sys.modules["matplotlib"]
    state = dict(state)
    backend = state.pop("backend", None)
    dict.update(mpl.rcParams, state)  # the values were validated when they were set
    if backend is None or dict.__getitem__(mpl.rcParams, "backend") == backend:
        return
    if "matplotlib.pyplot" in sys.modules and isinstance(backend, str):
        sys.modules["matplotlib.pyplot"].switch_backend(backend)
    else:
        dict.__setitem__(mpl.rcParams, "backend", backend)


def _torch_capture() -> Any:
    torch = sys.modules["torch"]
    state: dict[str, Any] = {
        "cpu": torch.get_rng_state(),
        "default_dtype": torch.get_default_dtype(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
    }
    # only when the notebook has started CUDA: asking would start it (and take memory)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _torch_restore(state: Any) -> None:
    torch = sys.modules["torch"]
    torch.set_rng_state(state["cpu"])
    torch.set_default_dtype(state["default_dtype"])
    torch.use_deterministic_algorithms(state["deterministic"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def _tf_capture() -> Any:
    from tensorflow.python.eager import context
    from tensorflow.python.ops import stateful_random_ops

    ctx = context.context()
    state: dict[str, Any] = {"seed": ctx._seed, "rng": ctx._rng.getstate() if ctx._rng else None}
    gen = stateful_random_ops.global_generator
    if gen is not None:
        state["generator"] = (gen.algorithm, gen.state.numpy())
    return state


def _tf_restore(state: Any) -> None:
    from tensorflow.python.eager import context
    from tensorflow.python.ops import stateful_random_ops

    ctx = context.context()
    if state["seed"] is not None:
        ctx._set_global_seed(state["seed"])
    if state["rng"] is not None and ctx._rng is not None:
        ctx._rng.setstate(state["rng"])
    if "generator" in state:
        _, value = state["generator"]
        gen = stateful_random_ops.get_global_generator()
        gen.reset(value)


def _ipython_capture() -> Any:
    shell = _shell()
    if shell is None:  # not in a kernel: nothing of IPython's to keep
        return None
    formatter = shell.display_formatter.formatters["text/plain"]
    return {
        "extensions": sorted(shell.extension_manager.loaded),
        "config": copy.deepcopy(dict(shell.config)),
        "xmode": shell.InteractiveTB.mode,
        "precision": formatter.float_precision,
    }


def _ipython_restore(state: Any) -> None:
    from traitlets.config import Config

    shell = _shell()
    if shell is None or state is None:
        return
    for name in state["extensions"]:
        if name not in shell.extension_manager.loaded:
            shell.extension_manager.load_extension(name)
    config = Config(state["config"])
    if config != shell.config:
        shell.config.merge(config)
        for configurable in shell.configurables:
            configurable.update_config(config)
    if shell.InteractiveTB.mode != state["xmode"]:
        shell.InteractiveTB.set_mode(state["xmode"])
    formatter = shell.display_formatter.formatters["text/plain"]
    if formatter.float_precision != state["precision"]:
        formatter.float_precision = state["precision"]


def _shell() -> Any:
    from IPython import get_ipython

    return get_ipython()


def _set_recursion_limit(limit: Any) -> None:
    sys.setrecursionlimit(int(limit))


# scikit-learn numbers the HTML reprs of its estimators from module-level counters
# (``sk-container-id-N``): restarted at 1 after a resume, the notebook's outputs would
# repeat element ids an uninterrupted run never repeats
_SKLEARN_REPR = ("sklearn.utils._repr_html.", "sklearn.utils._estimator_html_repr")


def _sklearn_counters() -> dict[str, Any]:
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(_SKLEARN_REPR):
            continue
        for attr, value in list(vars(module).items()):
            if type(value).__name__ == "_IDCounter" and isinstance(
                getattr(value, "count", None), int
            ):
                found[f"{name}:{attr}"] = value
    return found


def _sklearn_capture() -> Any:
    return {key: counter.count for key, counter in _sklearn_counters().items()}


def _sklearn_restore(state: Any) -> None:
    counters = _sklearn_counters()
    for key, count in dict(state).items():
        if key in counters:
            counters[key].count = int(count)


PARTS.extend(
    [
        Part("cwd", ENV, os.getcwd, os.chdir),
        Part("sys.path", ENV, lambda: list(sys.path), _path_restore),
        Part("os.environ", ENV, _env_capture, _env_restore),
        Part("IPython", CONFIG, _ipython_capture, _ipython_restore),
        Part("warnings filters", CONFIG, lambda: list(warnings.filters), _warnings_restore),
        Part("logging", CONFIG, _logging_capture, _logging_restore),
        Part("decimal context", CONFIG, lambda: decimal.getcontext().copy(), decimal.setcontext),
        Part("recursion limit", CONFIG, sys.getrecursionlimit, _set_recursion_limit),
        Part("numpy options", CONFIG, _np_options_capture, _np_options_restore, "numpy"),
        Part("pandas options", CONFIG, _pandas_capture, _pandas_restore, "pandas"),
        Part("matplotlib rcParams", CONFIG, _mpl_capture, _mpl_restore, "matplotlib"),
        Part("scikit-learn repr ids", CONFIG, _sklearn_capture, _sklearn_restore, "sklearn"),
        Part("random", LAST, random.getstate, random.setstate),
        Part(
            "numpy.random",
            LAST,
            lambda: _numpy().random.get_state(),
            _np_random_restore,
            "numpy.random",
        ),
        Part("torch", LAST, _torch_capture, _torch_restore, "torch"),
        Part("tensorflow", LAST, _tf_capture, _tf_restore, "tensorflow"),
    ]
)


def capture() -> tuple[dict[str, Any], dict[str, str]]:
    """Every active part's state, and the parts that failed to capture (with why)."""
    state: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for part in active():
        try:
            state[part.name] = part.capture()
        except Exception as exc:  # a library version we do not know: say so, go on
            failed[part.name] = f"{type(exc).__name__}: {exc}"[:200]
    return state, failed


def restore(state: dict[str, Any], stage: int) -> dict[str, str]:
    """Put back the parts of ``stage``; return the parts that failed, with why."""
    failed: dict[str, str] = {}
    for part in PARTS:
        if part.stage != stage or part.name not in state:
            continue
        if part.module is not None and part.module not in sys.modules:
            failed[part.name] = f"{part.module} could not be imported again"
            continue
        try:
            part.restore(state[part.name])
        except Exception as exc:
            failed[part.name] = f"{type(exc).__name__}: {exc}"[:200]
    return failed


def capture_env() -> dict[str, Any]:
    """The ENV parts (cheap: a cell's starting point is taken before every cell)."""
    return {"cwd": os.getcwd(), "sys.path": list(sys.path), "os.environ": _env_capture()}


def rng_states() -> dict[str, Any]:
    """The global generators' states as they are (cheap: taken before every cell)."""
    out: dict[str, Any] = {"random": random.getstate()}
    if "numpy.random" in sys.modules:
        with contextlib.suppress(Exception):
            out["numpy.random"] = _numpy().random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        with contextlib.suppress(Exception):
            out["torch"] = torch.get_rng_state()
    return out


def same_rngs(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether no global generator moved between the two :func:`rng_states`."""
    if before.keys() != after.keys() or before["random"] != after["random"]:
        return False
    if "numpy.random" in before:
        a, b = before["numpy.random"], after["numpy.random"]
        if a[2:] != b[2:] or a[1].tobytes() != b[1].tobytes():
            return False
    if "torch" in before:
        return bool(before["torch"].numpy().tobytes() == after["torch"].numpy().tobytes())
    return True


def rngs_json(states: dict[str, Any]) -> dict[str, Any]:
    """:func:`rng_states` as JSON-able values, for a replay (torch's is not kept)."""
    out: dict[str, Any] = {"random": states["random"]}
    if "numpy.random" in states:
        name, key, pos, has_gauss, cached = states["numpy.random"]
        out["numpy.random"] = [name, key.tolist(), pos, has_gauss, cached]
    return out


def restore_rngs(state: dict[str, Any]) -> dict[str, str]:
    """Set the random generators' states saved in ``state``; what could not be, by name."""
    failed: dict[str, str] = {}
    try:
        if "random" in state:
            version, internal, gauss = state["random"]
            random.setstate((version, tuple(internal), gauss))
        if "numpy.random" in state:
            np = _numpy()
            name, key, pos, has_gauss, cached = state["numpy.random"]
            np.random.set_state((name, np.array(key, dtype=np.uint32), pos, has_gauss, cached))
    except Exception as exc:
        failed["random"] = f"{type(exc).__name__}: {exc}"[:200]
    return failed


# -- generators the notebook holds ----------------------------------------------------
def owned_rngs(ns: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """The random generators the notebook holds in variables (``random.Random``, numpy's
    ``Generator`` and ``RandomState``), each with its state as JSON-able values. Taken
    before and after every cell (cheap: a type check per variable), so a replay of a
    cell that drew from one starts it where the cell first did."""
    np = sys.modules.get("numpy")
    out: dict[str, tuple[str, Any]] = {}
    for name, value in ns.items():
        if name.startswith("_"):
            continue
        kind = type(value)
        try:
            if kind is random.Random:
                version, internal, gauss = value.getstate()
                out[name] = ("random", [version, list(internal), gauss])
            elif np is not None and kind is np.random.Generator:
                out[name] = ("numpy.Generator", value.bit_generator.state)
            elif np is not None and kind is np.random.RandomState:
                bit, key, pos, has_gauss, cached = value.get_state()
                out[name] = ("numpy.RandomState", [bit, key.tolist(), pos, has_gauss, cached])
        except Exception:  # a generator whose state cannot be read is left alone
            continue
    return out


def set_owned_rngs(ns: dict[str, Any], states: dict[str, Any]) -> dict[str, str]:
    """Put generators the notebook holds back to the states :func:`owned_rngs` took."""
    failed: dict[str, str] = {}
    for name, (kind, state) in states.items():
        value: Any = ns.get(name)
        try:
            if kind == "random" and type(value) is random.Random:
                version, internal, gauss = state
                value.setstate((version, tuple(internal), gauss))
            elif kind == "numpy.Generator" and type(value).__name__ == "Generator":
                value.bit_generator.state = state
            elif kind == "numpy.RandomState" and type(value).__name__ == "RandomState":
                bit, key, pos, has_gauss, cached = state
                value.set_state((bit, _numpy().array(key, dtype="uint32"), pos, has_gauss, cached))
        except Exception as exc:
            failed[f"generator {name!r}"] = f"{type(exc).__name__}: {exc}"[:200]
    return failed
