"""The Python entry points: create or reopen a run, execute, resume.

``execute_notebook`` takes papermill's arguments with papermill's meaning, so a
papermill user can switch by changing the import.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime
import difflib
import hashlib
import json
import logging
import os
import secrets
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ._errors import (
    CellExecutionError,
    InputChangedError,
    ParameterError,
    SpotbookError,
    UsageError,
    papermill_compatible,
)
from ._models import (
    NBCLIENT_ARGS,
    AttemptRecord,
    Limits,
    Outcome,
    RunRequest,
    RunSpec,
    RunStatus,
    SnapshotPolicy,
)
from .attempt.cells import CELL_END, CELL_START
from .attempt.context import RunnerOptions
from .attempt.executor import check_kernel
from .attempt.progress import ProgressBar
from .attempt.runner import Runner, RunResult
from .notebook import document as nbs
from .notebook.parameters import Parameter, inspect_source
from .store.index import forget_run, note_run
from .store.integrity import Key, load_key
from .store.runstore import (
    RunStore,
    check_writable,
    is_url,
    library_runs_dir,
    named_id,
    new_run_id,
    read_url,
    resolve_run,
)

log = logging.getLogger(__name__)

# papermill engine arguments that have no meaning here (progress is always saved)
_PAPERMILL_NO_OPS = frozenset({"autosave_cell_every"})
# engine_name values that mean spotbook's own engine (nbclient runs the cells)
_ENGINES = (None, "nbclient", "spotbook")


def _abs(path: str | None) -> str | None:
    if path is None or is_url(path):
        return path
    return os.path.abspath(path)


def _input(input_path: Any) -> tuple[str, bytes]:
    """(where, bytes) of papermill's kinds of input: a path or URL (str or Path), or a
    notebook object (NotebookNode)."""
    if isinstance(input_path, Mapping):
        return "<NotebookNode>", json.dumps(input_path).encode()
    if isinstance(input_path, os.PathLike):
        input_path = os.fspath(input_path)
    if not isinstance(input_path, str):
        raise UsageError(
            f"input_path must be a path, a URL or a notebook, not {type(input_path).__name__}"
        )
    return input_path, read_url(input_path)


def _path(value: Any) -> str | None:
    return None if value is None else str(os.fspath(value))


def parameterize_path(path: Any, parameters: Mapping[str, Any]) -> Any:
    """papermill's path templates: ``out_{alpha}.ipynb`` with ``-p alpha 2`` is
    ``out_2.ipynb``; ``{pm[run_uuid]}``, ``{pm[current_datetime_utc]}`` and
    ``{pm[current_datetime_local]}`` are papermill's built-ins. Notebook objects, None
    and paths without braces pass through."""
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str) or "{" not in path:
        return path
    now = datetime.datetime.now
    builtins = {
        "run_uuid": str(uuid.uuid4()),
        "current_datetime_local": now(),
        "current_datetime_utc": now(datetime.UTC).replace(tzinfo=None),
    }
    try:
        return path.format(**{"pm": builtins, **parameters})
    except KeyError as exc:
        raise ParameterError(
            f"the path {path!r} names {{{exc.args[0]}}}, which no parameter gives: pass "
            f"-p {exc.args[0]} VALUE, or write {{{{ and }}}} for a literal brace"
        ) from None
    except (IndexError, ValueError, AttributeError) as exc:
        raise ParameterError(
            f"the path {path!r} is not a valid template ({exc}); write {{{{ and }}}} for a "
            "literal brace"
        ) from None


def notebook_parameters(
    notebook_path: Any, parameters: Mapping[str, Any] | None = None
) -> list[Parameter] | None:
    """The parameters a notebook's ``parameters`` cell assigns, in order; None when no
    cell is tagged ``parameters``. ``parameters`` fill a templated path."""
    where, data = _input(parameterize_path(notebook_path, dict(parameters or {})))
    nb = nbs.parse(data, repr(where))
    cell = _parameters_cell(nb)
    if cell is None:
        return None
    if nbs.kernel_language(nb) != "python":
        log.warning(
            "%s is a %s notebook: spotbook reads the parameters of Python notebooks only",
            where,
            nbs.kernel_language(nb),
        )
        return []
    return inspect_source(str(cell.source)) if cell.cell_type == "code" else []


def _parameters_cell(nb: Any) -> Any:
    """The cell tagged ``parameters``, or None."""
    return next((c for c in nb.cells if nbs.PARAMETERS_TAG in c.metadata.get("tags", [])), None)


def _warn_unknown_parameters(nb: Any, params: Mapping[str, Any], language: str, where: Any) -> None:
    """papermill's warnings: a parameter the ``parameters`` cell does not assign (with
    the closest name it does, as a typo usually is), and parameters passed to a notebook
    that has no such cell. They are injected all the same, as papermill injects them."""
    if not params:
        return
    cell = _parameters_cell(nb)
    if cell is None:
        log.warning(
            "%s has no cell tagged %r: the parameters are injected at the top",
            where,
            nbs.PARAMETERS_TAG,
        )
        return
    if language != "python" or cell.cell_type != "code":
        return
    known = [p.name for p in inspect_source(str(cell.source))]
    for name in params:
        if name not in known and not name.startswith("PAPERMILL_"):  # --inject-paths
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            log.warning("Passed unknown parameter: %s%s", name, hint)


def _identity(content: str, output: str | None, kernel: str, cwd: str | None) -> str:
    """What defines a run made without --run-dir: the parameterised notebook's content
    hash, OUTPUT and the working directory (absolute), and the kernel."""
    parts = [content, output or "", kernel, cwd or ""]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _identity_file(url: str, identity: str) -> str:
    """Beside the runs folder (whose every entry is a run): its last run's id."""
    return os.path.join(os.path.dirname(os.path.dirname(url)), "identities", identity)


def _interrupted_run(url: str, identity: str) -> str | None:
    """The store of the last run with this identity beside ``url``, when it was
    interrupted (its process gone) and so may be continued; else None."""
    from ._status import describe

    try:
        with open(_identity_file(url, identity), encoding="ascii") as fh:
            earlier = fh.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not named_id(earlier):
        return None
    where = os.path.join(os.path.dirname(url), earlier)
    try:
        status = describe(RunStore(where))["status"]
    except SpotbookError:
        return None
    return where if status == RunStatus.INTERRUPTED.value else None


def _note_identity(url: str, identity: str, run_id: str) -> None:
    path = _identity_file(url, identity)
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w", encoding="ascii") as fh:
            fh.write(run_id + "\n")
        os.replace(f"{path}.{os.getpid()}", path)


def inspect_notebook(
    notebook_path: Any, parameters: Mapping[str, Any] | None = None
) -> dict[str, dict[str, str]]:
    """papermill's ``inspect_notebook``: name -> ``{name, inferred_type_name, default,
    help}`` for each parameter of the ``parameters`` cell (``inferred_type_name`` is
    "None" where the cell gives no type); empty without such a cell."""
    found = notebook_parameters(notebook_path, parameters) or []
    return {p.name: dataclasses.asdict(p) for p in found}


def prepare_run(
    input_path: Any,
    output_path: str | os.PathLike[str] | None = None,
    *,
    parameters: Mapping[str, Any] | None = None,
    kernel_name: str | None = None,
    cwd: str | None = None,
    limits: Limits | None = None,
    snapshot: SnapshotPolicy | None = None,
    run_dir: str | None = None,
    restart: bool = False,
    strict_resume: bool = False,
    allow_errors: bool = False,
    nbclient: Mapping[str, Any] | None = None,
    key: Key | None = None,
    here: bool = True,
    runs_dir: str | None = None,
    report_mode: bool = False,
    language: str | None = None,
    prepare_only: bool = False,
) -> RunStore:
    """Freeze the parameterised notebook into a run store (or reopen a matching one):
    ``prepare`` of a ``RunRequest`` made of these arguments."""
    request = RunRequest(
        input_path,
        output_path,
        parameters=dict(parameters or {}),
        kernel_name=kernel_name,
        language=language,
        report_mode=report_mode,
        cwd=cwd,
        limits=limits or Limits(),
        snapshot=snapshot or SnapshotPolicy(),
        run_dir=run_dir,
        restart=restart,
        strict_resume=strict_resume,
        allow_errors=allow_errors,
        prepare_only=prepare_only,
        nbclient=dict(nbclient or {}),
    )
    return prepare(request, key=key, here=here, runs_dir=runs_dir)


def prepare(
    request: RunRequest, *, key: Key | None = None, here: bool = True, runs_dir: str | None = None
) -> RunStore:
    """Freeze the parameterised notebook of ``request`` into a run store (or reopen a
    matching one); for ``prepare_only``, also write it to ``output``, as papermill's
    ``--prepare-only`` does. See ``_freeze``."""
    store = _freeze(request, key=key, here=here, runs_dir=runs_dir)
    # run.json as _freeze sealed it (read again only if it did not write it)
    run = store.checked_run or store.require_run()
    output = run["spec"].get("output") if request.prepare_only else None
    if output:
        from .store.runstore import write_url

        data = store.read("input.ipynb")
        assert data is not None
        write_url(output, data)
    return store


def parameterized_notebook(request: RunRequest) -> tuple[str, nbs.Notebook, str]:
    """(where it was read, the notebook with ``request``'s parameters injected, its
    language): what a run of ``request`` freezes, read and checked; nothing written."""
    params = dict(request.parameters)
    where, data = _input(parameterize_path(request.notebook, params))
    nb = nbs.parse(data, repr(where))
    language = request.language or nbs.kernel_language(nb)
    _warn_unknown_parameters(nb, params, language, where)
    return where, nbs.inject_parameters(nb, params, request.kernel_name, language), language


def _freeze(request: RunRequest, *, key: Key | None, here: bool, runs_dir: str | None) -> RunStore:
    """Freeze the parameterised notebook of ``request`` into a run store (or reopen a
    matching one).

    The run is sealed with ``key`` (default: this machine's, see ``store/integrity.py``).
    ``here``: the run will execute on this machine, so its kernel must be installed here
    (``submit`` passes False: the kernel is in the image). Without ``run_dir`` the store
    is ``runs_dir/<run id>`` (default: ``.spotbook/runs`` here). ``report_mode`` hides
    the code cells' input, as papermill's does. ``language`` overrides the notebook's
    (parameters are written in it); a notebook that is not Python can only be
    ``prepare_only`` (frozen with its parameters, never run). Bad input of every kind is
    refused before anything is written.
    """
    r = request
    params = dict(r.parameters)
    where, nb, language = parameterized_notebook(r)
    output_path = _path(parameterize_path(r.output, params))
    source = _abs(where) if where != "<NotebookNode>" else where
    assert source is not None
    if language != "python" and not r.prepare_only:
        raise UsageError(
            f"this is a {language} notebook: spotbook runs Python notebooks only (it "
            "restores a Python kernel's state after a preemption); prepare_only "
            "(--prepare-only) writes it with its parameters without running it"
        )
    if r.report_mode:
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
    if output_path:
        check_writable(output_path)
    if r.cwd is not None and not os.path.isdir(r.cwd):
        raise UsageError(f"--cwd {r.cwd!r} is not a directory")
    kernel, content = nbs.kernel_name(nb, r.kernel_name), nbs.content_hash(nb)
    output, cwd = _abs(output_path), _abs(r.cwd)
    if here and not r.prepare_only:
        check_kernel(kernel)
    run_id = new_run_id()
    identity = None
    if r.run_dir:
        url = _abs(r.run_dir)
    else:
        url = os.path.join(runs_dir, run_id) if runs_dir else resolve_run(run_id)
        # the same command again continues the run it interrupted, as a batch user reruns
        # a crashed job; after it succeeded (or failed) it is a new run, as papermill's
        identity = _identity(content, output, kernel, cwd)
        earlier = None if r.restart or r.prepare_only else _interrupted_run(url, identity)
        if earlier is not None:
            url = earlier
    assert url is not None
    store = RunStore(url)
    spec = RunSpec(
        run_id=run_id,
        source=source,
        output=output,
        parameters=params,
        kernel_name=kernel,
        cwd=cwd,
        input_sha256=content,
        limits=r.limits,
        snapshot=r.snapshot,
        hash_seed=os.environ.get("PYTHONHASHSEED") or str(secrets.randbelow(2**32)),
        strict_resume=r.strict_resume,
        allow_errors=r.allow_errors,
        nbclient=dict(r.nbclient),
    )
    existing = store.read_json("run.json")
    if existing is not None and not r.restart:
        # Only a run whose seal holds is continued: re-sealing must not vouch for
        # what someone without the key wrote.
        existing = store.unseal(strict=r.strict_resume, run=store.valid_run(existing))
        old = RunSpec.from_json(existing["spec"], f"{url}/run.json")
        if old.input_sha256 != spec.input_sha256:
            raise InputChangedError(
                f"{url} holds run {old.run_id} of a different notebook or parameters "
                f"({old.source}); resume it with `spotbook resume {url}`, choose another "
                "--run-dir, or pass --restart to discard it and start over"
            )
        # Same notebook: continue it. Limits and output may be changed by the new command.
        spec = RunSpec(
            **{
                **vars(spec),
                "run_id": old.run_id,
                "created": old.created,
                "hash_seed": old.hash_seed,  # its kernels so far hashed strings this way
            }
        )
        frozen = store.read("input.ipynb")
        assert store.seal is not None
        if frozen is None or not store.input_matches(existing, frozen):
            raise store.seal.refuse("input.ipynb", "does not match the hash sealed in run.json")
        if store.seal.legacy:  # an older store stays what it is (see LEGACY_ENV)
            store.write_run({**existing, "spec": spec.to_json()})
            return store
        # a generation more than the one checked: an attempt from now on is refused
        # beside the run.json of before (its limits and flags) if that one is put back
        seal = store.seal_run(
            key or load_key(),
            spec.to_json(),
            frozen,
            generation=store.run_generation + 1,
            fmt=store.seal.format,  # its objects so far are sealed in that format
        )
        store.write_run({**existing, "spec": spec.to_json(), "seal": seal})
        return store
    if existing is not None:
        # --restart: a new run at this place, under a new id. Every object the old run
        # sealed is bound to the old id, so none can pass for the new run's: not when
        # the restart's own attempts are deleted (or the store rolled back to before it),
        # and not when run.json was another run's (its id is never taken unchecked).
        old_spec = existing.get("spec") if isinstance(existing, dict) else None
        old_id = old_spec.get("run_id") if isinstance(old_spec, dict) else None
        if isinstance(old_id, str) and old_id != spec.run_id:
            forget_run(old_id)
    # everything that can fail on bad input (the key, the spec's JSON) before any write;
    # run.json, written last, is what makes the run exist
    frozen = nbs.dumps(nb).encode()
    seal = store.seal_run(key or load_key(), spec.to_json(), frozen)
    json.dumps(spec.to_json())
    store.write("input.ipynb", frozen)
    store.write_run(
        {
            "spec": spec.to_json(),
            "status": RunStatus.PENDING.value,
            "restart": r.restart,
            "seal": seal,
        }
    )
    if identity is not None and not is_url(url):
        _note_identity(url, identity, spec.run_id)
    note_run(store.url, spec.run_id)  # `spotbook runs` finds it, from any folder
    if r.restart:
        store.claim_attempt(
            AttemptRecord(outcome=Outcome.RESTART.value, resumed_from=0, restart=True)
        )
        # the old run's records, snapshots and attempts no longer count (the claim above
        # bounds them); its checkpoint files must not be found by the new run either
        store.discard_checkpoint_files()
    return store


def run_attempt(
    store: RunStore,
    options: RunnerOptions | None = None,
    run: dict[str, Any] | None = None,
    *,
    on_start: OnStart | None = None,
    continues: bool = False,
) -> RunResult:
    """One attempt at the run in ``store`` (``run``: its run.json as just read, see
    ``Runner``), in a thread of its own when called from a running event loop (inside
    Jupyter); a failed cell raises a papermill-compatible ``CellExecutionError``.
    ``on_start`` is told which run starts once its seal is checked (nothing unchecked
    reaches it), before its kernel starts; ``continues``: say from where it continues."""
    runner = Runner.open(store, options, run=run)
    if on_start is not None:
        read = (runner.run_doc, runner.nb) if continues else None
        on_start(_started(store, runner.spec.run_id, read))
    try:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return runner.run()
        # Called from a running loop (e.g. inside Jupyter): run in a thread of our own.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(runner.run).result()
    except CellExecutionError as exc:
        exc.run_dir = runner.store.url  # where the run, and its output, are kept
        # papermill's users catch PapermillExecutionError: raise one where they can
        raise papermill_compatible(exc) from exc.__cause__


def execute_notebook(
    input_path: Any,
    output_path: str | os.PathLike[str] | None,
    parameters: Mapping[str, Any] | None = None,
    engine_name: str | None = None,
    request_save_on_cell_execute: bool = True,
    prepare_only: bool = False,
    kernel_name: str | None = None,
    language: str | None = None,
    progress_bar: bool | Mapping[str, Any] = True,
    log_output: bool = False,
    stdout_file: Any = None,
    stderr_file: Any = None,
    start_timeout: float = 60,
    report_mode: bool = False,
    cwd: str | os.PathLike[str] | None = None,
    *,
    execution_timeout: float | None = None,
    timeout: float | None = None,
    run_dir: str | None = None,
    snapshot: str = "auto",
    restart: bool = False,
    strict_resume: bool = False,
    **papermill_kwargs: Any,
) -> Any:
    """Run a notebook like ``papermill.execute_notebook``; return the output notebook.

    Progress is committed to the run store after every cell, and a run killed
    part-way is resumed by calling this again with the same ``run_dir`` (or
    ``spotbook resume``). Without ``run_dir`` the store goes in the user's cache
    (``store.runstore.library_runs_dir``), never the working directory. Raises
    :class:`spotbook.CellExecutionError` when a cell fails, after writing the output
    notebook with the failure marked (also a papermill ``PapermillExecutionError`` where
    papermill is loaded).
    """
    # nbclient's arguments, which papermill passes to its engine
    allow_errors = bool(papermill_kwargs.pop("allow_errors", False))
    nbclient = {k: papermill_kwargs.pop(k) for k in list(papermill_kwargs) if k in NBCLIENT_ARGS}
    if "extra_arguments" in nbclient:
        nbclient["extra_arguments"] = list(nbclient["extra_arguments"])
    start_timeout = papermill_kwargs.pop("startup_timeout", start_timeout)  # nbclient's name
    unknown = set(papermill_kwargs) - _PAPERMILL_NO_OPS
    if unknown:
        raise TypeError(
            f"execute_notebook() got unexpected arguments: {sorted(unknown)} (it takes "
            f"papermill's, and nbclient's {', '.join(sorted(NBCLIENT_ARGS))}, allow_errors "
            "and startup_timeout)"
        )
    if engine_name not in _ENGINES:
        raise UsageError(
            f"engine_name {engine_name!r}: spotbook runs notebooks with its own engine "
            "(nbclient underneath); leave it out or give 'nbclient'"
        )
    # every cell's progress is saved to the run store whatever
    # request_save_on_cell_execute says
    del request_save_on_cell_execute
    bar = ProgressBar(progress_bar, describe_cells=not log_output)
    request = RunRequest(
        input_path,
        output_path,
        parameters=dict(parameters or {}),
        kernel_name=kernel_name,
        language=language,
        report_mode=report_mode,
        cwd=_path(cwd),
        limits=Limits(
            execution_timeout=execution_timeout,
            run_timeout=timeout,
            start_timeout=start_timeout,
        ),
        snapshot=SnapshotPolicy.parse(snapshot),
        run_dir=run_dir,
        restart=restart,
        strict_resume=strict_resume,
        allow_errors=allow_errors,
        prepare_only=prepare_only,
        nbclient=nbclient,
    )
    store = prepare(request, runs_dir=None if run_dir else library_runs_dir())
    if prepare_only:  # prepare wrote it to output_path
        data = store.read("input.ipynb")
        assert data is not None
        return nbs.parse(data, "input.ipynb")
    on_output = outputs_to(_log_output if log_output else None, stdout_file, stderr_file)
    run_attempt(store, RunnerOptions(on_output=on_output, progress=bar, handle_signals=False))
    data = store.read("output.ipynb")
    assert data is not None
    return nbs.parse(data, "output.ipynb")


OutputHandler = Callable[[str, dict[str, Any]], None]


def outputs_to(
    echo: OutputHandler | None, stdout_file: Any, stderr_file: Any
) -> OutputHandler | None:
    """As papermill: streams to ``stdout_file``/``stderr_file`` (file objects) as they
    come, and every output to ``echo`` (the log, or the CLI's stderr)."""
    if not (echo or stdout_file or stderr_file):
        return None

    def on_output(kind: str, content: dict[str, Any]) -> None:
        if echo is not None:
            echo(kind, content)
        if kind == "stream":
            to = stdout_file if content.get("name") == "stdout" else stderr_file
            if to is not None:
                to.write(str(content.get("text", "")))
                to.flush()

    return on_output


def cell_separator(kind: str, content: dict[str, Any]) -> str | None:
    """papermill's --log-output line where a cell begins or ends (its number counts
    every cell from 1, as papermill's does); None for the kernel's outputs."""
    if kind == CELL_START:
        return f"Executing Cell {content['index'] + 1:-<40}"
    if kind == CELL_END:
        return f"Ending Cell {content['index'] + 1:-<43}"
    return None


def output_line(kind: str, content: dict[str, Any]) -> str:
    """What papermill's --log-output shows for one of a run's outputs, ending in a newline
    ("" for none): a cell's separator, the text an output printed, or an error's name and
    value."""
    separator = cell_separator(kind, content)
    if separator is not None:
        return separator + "\n"
    if kind == "error":
        text = f"{content.get('ename')}: {content.get('evalue')}"
    else:
        text = content.get("text") or (content.get("data") or {}).get("text/plain", "")
        text = "".join(text) if isinstance(text, list) else str(text)
    return text if not text or text.endswith("\n") else f"{text}\n"


def _log_output(kind: str, content: dict[str, Any]) -> None:
    separator = cell_separator(kind, content)
    if separator is not None:
        logging.getLogger("spotbook.output").info(separator)
        return
    text = content.get("text") or (content.get("data") or {}).get("text/plain", "")
    if text:
        logging.getLogger("spotbook.output").info(str(text).rstrip("\n"))


@dataclasses.dataclass(frozen=True)
class RunStarted:
    """A run about to begin an attempt: which run, where its store is, and, for a run
    that was interrupted, how far it had got (what a command's first line says)."""

    run_id: str
    url: str
    store: RunStore = dataclasses.field(repr=False, compare=False)
    # (cells done, cells in all) of the interrupted run this attempt continues
    interrupted_at: tuple[int, int] | None = None

    def notebook(self, which: str) -> bytes | None:
        """The run's ``input`` (frozen) or ``output`` notebook as its store holds it now."""
        return self.store.read(f"{which}.ipynb")


OnStart = Callable[[RunStarted], None]


def _started(
    store: RunStore, run_id: str, continued: tuple[dict[str, Any], Any] | None = None
) -> RunStarted:
    """The run in ``store`` as it starts; ``continued``: its run.json (checked) and frozen
    notebook as the attempt read them, to say whether it continues an interrupted run (one
    frozen by --prepare-only runs nothing, so continues nothing)."""
    from ._status import interrupted_at

    at = None if continued is None else interrupted_at(store, *continued)
    return RunStarted(run_id, store.url, store, at)


def run_here(
    request: RunRequest,
    options: RunnerOptions | None = None,
    *,
    on_start: OnStart | None = None,
    key: Key | None = None,
    runs_dir: str | None = None,
) -> RunResult:
    """``spotbook run``: freeze the run ``request`` asks for (or reopen the matching one,
    see ``prepare``) and run it here as one attempt, from the cell after the last
    committed one. ``on_start`` is told which run starts, and from where, before its
    kernel starts. A ``prepare_only`` request runs nothing: its result is the run, pending.
    Raises :class:`CellExecutionError` when a cell fails (its ``run_dir`` says where the
    run and its output are)."""
    store = prepare(request, key=key, runs_dir=runs_dir)
    if not request.prepare_only:
        return run_attempt(store, options, store.checked_run, on_start=on_start, continues=True)
    run = store.checked_run or store.require_run()
    if on_start is not None:
        on_start(_started(store, run["spec"]["run_id"]))
    raw = store.read("input.ipynb")
    assert raw is not None  # prepare wrote it
    nb = nbs.load_frozen(raw)
    return RunResult(
        run_id=run["spec"]["run_id"],
        url=store.url,
        status=RunStatus.PENDING,
        cells_done=0,
        cells_total=sum(1 for c in nb.cells if nbs.executable(c)),
        attempt=0,
        output=run["spec"].get("output"),
    )


def resume_run(
    run: str, *, options: RunnerOptions | None = None, on_start: OnStart | None = None
) -> RunResult:
    """Continue a run after its last committed cell, restoring kernel state (``spotbook
    resume``); ``on_start`` is told which run it is before its kernel starts."""
    store = RunStore(resolve_run(run))
    checked = store.require_run_of(named_id(run))
    return run_attempt(store, options, checked, on_start=on_start)
