"""Value types shared by every layer: options, run spec, records. No I/O."""

from __future__ import annotations

import datetime
import enum
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypedDict

from ._errors import StoreIntegrityError, UsageError

__version__ = "0.1.0"  # pyproject.toml's version


class RunStatus(enum.StrEnum):
    """Where a run stands, derived from its store."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    RESUME_REFUSED = "resume-refused"
    CANCELLED = "cancelled"  # its Job was deleted by `spotbook cancel` before it succeeded

    # The groupings every command uses (one place, so that they cannot disagree):
    @classmethod
    def of(cls, value: str) -> RunStatus | None:
        """The status named ``value``, or None (a cluster's live state, such as 'queued')."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def settled(self) -> bool:
        """Over: nothing more happens unless the user resumes or reruns it (a sweep's
        resume leaves such a point alone; a drill has no attempt left to wait for)."""
        return self in (self.SUCCEEDED, self.FAILED, self.RESUME_REFUSED, self.CANCELLED)

    @property
    def unsettled(self) -> bool:
        """Not over: it waits to start, runs, or waits to be resumed."""
        return not self.settled

    @property
    def unsuccessful(self) -> bool:
        """Over, and not as the notebook should end (a cell failed, or a resume refused)."""
        return self in (self.FAILED, self.RESUME_REFUSED)


def runner_mark(run_id: str) -> str:
    """The name of the file a runner holds open for its whole attempt (in its private
    temporary directory): what proves a pid in an attempt record is that run's runner
    before ``cancel`` or ``drill`` signals it (a record alone could name any process)."""
    return f"spotbook-runner-{run_id}"


class Outcome(enum.StrEnum):
    """How one attempt ended."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    PREEMPTED = "preempted"
    STOPPED = "stopped"  # the user's stop (Ctrl-C, SIGINT): resumable, not a preemption
    KILLED = "killed"
    SUPERSEDED = "superseded"
    STORAGE_ERROR = "storage-error"
    ERROR = "error"  # ended by something unexpected (a bug): the traceback says what
    RESUME_REFUSED = "resume-refused"
    RESTART = "restart"  # not an attempt: --restart discarded every attempt before it


# outcomes of an attempt that was interrupted from outside (a notice, or none)
INTERRUPTED_OUTCOMES = frozenset({Outcome.PREEMPTED, Outcome.KILLED})


class CellStatus(enum.StrEnum):
    """What a cell's record in the store says of it."""

    COMPLETED = "completed"  # it ran to the end: committed, never run again
    FAILED = "failed"  # it raised: the run failed there
    EXITED = "exited"  # it ended the notebook early (sys.exit(0), papermill's way)
    EXECUTED = "executed"  # a note written before the cell ran: what to undo if it is lost


class NoticeCell(enum.StrEnum):
    """What the work running at a termination notice did."""

    NONE = "none"  # no cell was running
    STOPPED = "stopped"  # it saw spotbook.preempted() and returned early
    FINISHED = "finished"  # it finished within --grace
    INTERRUPTED = "interrupted"  # it outlived --grace and was interrupted; it runs again


class Notice(TypedDict, total=False):
    """How an attempt met its termination notice."""

    signal: str
    cell: str  # a NoticeCell's value
    seconds_to_stop: float


class AttemptRecord(TypedDict, total=False):
    """One attempt's record in the store (``attempts/NNNN.json``): claimed when it
    starts, added to as it learns, closed with its outcome."""

    attempt: int
    claim: str  # a token that makes the record its claimer's (the store's exclusive create)
    outcome: str  # an Outcome's value
    restart: bool  # the marker --restart leaves (outcome "restart")
    # where it ran
    host: str
    pid: int
    process_started: float
    pod: str
    namespace: str
    node: str
    image: str
    gpus: list[dict[str, str]]
    machine: dict[str, str]  # provider, machine_type, region, zone, capacity (spot|on-demand)
    frameworks: dict[str, Any]
    # when, and from where
    started: float
    ended: float
    resumed_from: int
    resumed_at: float  # from here on it ran cells never run before
    kernel_start_seconds: float
    stopped_at: int  # the first cell it left unfinished
    notice: Notice
    error: str
    # what the resume rebuilt
    restored_snapshot: str | None
    restored_bytes: int
    load_seconds: float
    unrestored: list[str]
    replayed: list[int]
    restore_seconds: float
    redone_seconds: float
    fidelity: dict[str, Any]
    fallback: dict[str, Any]
    files_given_back: list[str]
    # the run's files this node lacked, put back before the kernel started
    files_restored: dict[str, Any]
    # which machine: its boot id (a new one is another machine, or a reboot) and hostname
    boot_id: str
    environment_replayed: list[int]  # cells replayed first: the environment they changed
    snapshots_off: str
    snapshots_sync: str  # why snapshots were not taken in the background
    # why the kernel was not forked, its snapshots staged (copied, written by a thread)
    snapshots_staged: str
    snapshots_staging_fallback: str  # staging memory ran short: written in the pause
    snapshots_dropped: int  # staged ones refused: a buffer changed behind its counter
    background_snapshots: int
    snapshot_pause_max: float  # the longest a background snapshot stopped the notebook
    # checkpoint files (object stores)
    checkpoint_restored_bytes: int
    checkpoint_ready_seconds: float
    checkpoint_uploaded_bytes: int
    checkpoint_syncs: int
    checkpoint_files: int
    checkpoint_last_sync_seconds: float
    store_bytes: int
    # checkpoints inside cells (a loop's iteration boundary: spotbook.kernel.loops)
    loop_checkpoints: int
    loop_checkpoint_pause_max: float
    loops_not_resumable: dict[str, str]  # "cell:loop" -> why a kill there reruns the cell
    loop_checkpoints_off: str
    # the checkpoint inside a cell this attempt went on from: cell, loop, iteration,
    # total, at (when it was taken), attempt (which took it), cell_seconds
    resumed_in_cell: dict[str, Any]


# what ``spotbook status`` shows of each attempt (the rest is for diagnosis)
STATUS_ATTEMPT_FIELDS = (
    "attempt",
    "host",
    "pid",
    "pod",
    "namespace",
    "node",
    "image",
    "gpus",
    "machine",
    "frameworks",
    "started",
    "ended",
    "outcome",
    "resumed_from",
    "stopped_at",
    "notice",
    "restored_snapshot",
    "replayed",
    "unrestored",
    "kernel_start_seconds",
    "process_started",
    "resumed_at",
    "restore_seconds",
    "redone_seconds",
    "boot_id",
    "files_restored",
    "environment_replayed",
    "checkpoint_restored_bytes",
    "checkpoint_uploaded_bytes",
    "checkpoint_files",
    "fidelity",
    "fallback",
    "files_given_back",
    "snapshots_off",
    "snapshots_sync",
    "snapshots_staged",
    "snapshots_dropped",
    "background_snapshots",
    "snapshot_pause_max",
    "loop_checkpoints",
    "loops_not_resumable",
    "resumed_in_cell",
    "error",
)


class SnapshotMode(enum.StrEnum):
    """When kernel state is snapshotted."""

    EVERY_CELL = "every-cell"
    AUTO = "auto"
    OFF = "off"


@dataclass(frozen=True)
class SnapshotPolicy:
    """When kernel state is snapshotted.

    ``auto``: as often as the expected loss from a preemption justifies. A snapshot that
    costs the notebook ``C`` seconds, taken after every ``T`` seconds of compute, costs
    ``C / T`` of the run; a preemption (``hazard`` per node-hour: one every ``M = 3600 /
    hazard`` seconds on average) loses about ``T / 2`` of compute. The sum is least at
    Young's interval ``T = sqrt(2 C M)`` (with Daly's correction), which ``auto`` keeps,
    never closer than ``min_gap``. ``C`` is what the last snapshot cost (a background
    one: its pause, and its copy's share of the machine's CPUs), before the first an
    estimate (see the runner's ``Snapshots.due``). ``interval`` (when set) forces one
    after that much compute regardless of cost.
    """

    mode: SnapshotMode = SnapshotMode.AUTO
    min_gap: float = 0.5
    interval: float | None = None
    # written by a fork of the kernel while the notebook goes on, where that is safe
    background: bool = True
    hazard: float = 1.0  # preemptions expected per node-hour
    # the run's files saved with each snapshot: at most this many bytes, none that match
    files_budget: int = 20 << 30
    files_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files_exclude", tuple(self.files_exclude))
        if not (isinstance(self.files_budget, int) and self.files_budget >= 0):
            raise UsageError("--files-budget must be a size of zero bytes or more")
        if not all(isinstance(g, str) and g for g in self.files_exclude):
            raise UsageError("--files-exclude takes a non-empty glob")
        if self.min_gap < 0:
            raise UsageError("the snapshot policy's min gap must not be negative")
        if self.interval is not None and not (0 <= self.interval < math.inf):
            raise UsageError("--snapshot-interval must be a finite number of seconds, zero or more")
        if not (0 < self.hazard < math.inf):
            raise UsageError("--snapshot-hazard must be a positive rate (preemptions per hour)")

    def due(self, compute_since: float, last_cost: float | None) -> bool:
        """Whether to snapshot now, given compute since the last one and its cost."""
        if self.mode is SnapshotMode.OFF:
            return False
        if self.mode is SnapshotMode.EVERY_CELL:
            return True
        if self.interval is not None and compute_since >= self.interval:
            return True
        return compute_since >= self.gap(last_cost or 0.0)

    def gap(self, cost: float) -> float:
        """``auto``: the compute between snapshots that cost ``cost`` seconds each (the
        Young/Daly interval for ``hazard``, at least ``min_gap``)."""
        return max(self.min_gap, young_daly(cost, 3600.0 / self.hazard))

    @classmethod
    def parse(
        cls,
        text: str,
        interval: float | None = None,
        *,
        background: bool = True,
        hazard: float = 1.0,
        files_budget: int = 20 << 30,
        files_exclude: tuple[str, ...] = (),
    ) -> SnapshotPolicy:
        try:
            mode = SnapshotMode(text)
        except ValueError:
            choices = ", ".join(m.value for m in SnapshotMode)
            raise UsageError(f"--snapshot must be one of {choices}, not {text!r}") from None
        return cls(
            mode=mode,
            interval=interval,
            background=background,
            hazard=hazard,
            files_budget=files_budget,
            files_exclude=files_exclude,
        )


# auto's estimates of a snapshot's cost before one is measured: the least any costs (a
# round trip and a manifest), and what a background one stops the notebook for (a fork;
# measured 10-45 ms from 0.1 to 4 GiB of state on the 2-core machine,
# bench/bench_snapshot_pause.py)
CHEAPEST_SNAPSHOT = 0.003
BACKGROUND_PAUSE_ESTIMATE = 0.05


def young_daly(snapshot_seconds: float, mtbf: float) -> float:
    """The snapshot interval (compute seconds) that minimises expected loss: Young's
    ``sqrt(2 C M)``, with Daly's higher-order correction while ``C < 2 M``."""
    c, m = max(snapshot_seconds, 1e-6), mtbf
    if c >= 2 * m:
        return m
    r = c / (2 * m)
    return math.sqrt(2 * c * m) * (1 + math.sqrt(r) / 3 + r / 9) - c


_SIZE_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_SIZE_UNITS |= {"ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}


def parse_size(text: str, flag: str) -> int:
    """A size in bytes: '500000', '500M', '20G', '1.5GiB' (B optional)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*", str(text), re.I)
    if m is None:
        raise UsageError(f"{flag} takes a size such as 500M or 20G, not {text!r}")
    value = float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "").lower()]
    if not math.isfinite(value) or value > 1 << 60:
        raise UsageError(f"{flag} {text!r} is too large")
    return int(value)


def parse_rate(text: str, flag: str = "--hazard", allow_zero: bool = False) -> float:
    """A hazard rate: '1' or '1/h' per hour, '30/d' per day, '2/m' per minute."""
    per = {"h": 1.0, "d": 1 / 24, "m": 60.0, "s": 3600.0}
    number, _, unit = str(text).partition("/")
    try:
        value = float(number) * per[unit.strip() or "h"]
    except (ValueError, KeyError):
        value = math.nan
    if not (0 <= value < math.inf) or (value == 0 and not allow_zero):
        raise UsageError(f"{flag} {text!r}: give preemptions per hour, e.g. 1, 1/h, 12/d, 2/m")
    return value


@dataclass(frozen=True)
class Limits:
    """Time limits of a run (seconds; None means none)."""

    execution_timeout: float | None = None
    run_timeout: float | None = None
    start_timeout: float = 60.0
    grace: float = 8.0
    max_preemptions: int | None = None
    max_output_bytes: int = 8 * 1024 * 1024
    checkpoint_interval: float = 60.0  # object stores: sync checkpoint_dir() this often

    def __post_init__(self) -> None:
        for name, flag in (
            ("execution_timeout", "--execution-timeout"),
            ("run_timeout", "--timeout"),
        ):
            value = getattr(self, name)
            if value is not None and not (0 < value < math.inf):
                raise UsageError(
                    f"{flag} must be a positive, finite number of seconds, not {value!r} "
                    "(leave it out for no limit)"
                )
        for flag, value in (
            ("--start-timeout", self.start_timeout),
            ("--checkpoint-interval", self.checkpoint_interval),
        ):
            if not (0 < value < math.inf):
                raise UsageError(f"{flag} must be a positive, finite number of seconds")
        if not (0 <= self.grace < math.inf):
            raise UsageError("--grace must be a finite number of seconds, zero or more")
        if self.max_preemptions is not None and self.max_preemptions < 0:
            raise UsageError("--max-preemptions must be zero or more")
        if self.max_output_bytes <= 0:
            raise UsageError("--max-output-bytes must be positive")
        if self.checkpoint_interval <= 0:
            raise UsageError("--checkpoint-interval must be a positive number of seconds")


@dataclass(frozen=True)
class RunSpec:
    """What was asked: stored in ``run.json`` when the run is created."""

    run_id: str
    source: str
    output: str | None
    parameters: dict[str, Any]
    kernel_name: str
    cwd: str | None
    input_sha256: str
    limits: Limits = field(default_factory=Limits)
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    created: float = field(default_factory=time.time)
    # every kernel of the run gets this PYTHONHASHSEED, so a set or dict of strings
    # iterates in the same order after a resume as before it
    hash_seed: str | None = None
    # refuse to resume (exit 6) when the resumed run could differ
    strict_resume: bool = False
    # nbconvert's --allow-errors (nbclient's allow_errors): a failing cell's error stays
    # in the notebook and the run goes on; it succeeds
    allow_errors: bool = False
    # nbclient's arguments given to execute_notebook (NBCLIENT_ARGS), for every attempt
    nbclient: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_nbclient_args(self.nbclient)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["snapshot"]["mode"] = self.snapshot.mode.value
        if not self.allow_errors:  # as runs without it were sealed before it existed
            del data["allow_errors"]
        if not self.nbclient:  # likewise
            del data["nbclient"]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "run.json") -> RunSpec:
        """The spec run.json holds; StoreIntegrityError (exit 2) naming ``where`` for one
        that is not a spec (a field missing or of another type), never a traceback."""
        try:
            return cls._from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            what = f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)[:200]
            raise StoreIntegrityError(
                f"{where} holds a run spec spotbook cannot read ({what}); it was not used. "
                "Inspect the store, or start the run over with `spotbook run ... --restart`"
            ) from None

    @classmethod
    def _from_json(cls, data: dict[str, Any]) -> RunSpec:
        known = {f.name for f in fields(SnapshotPolicy)}
        # (run.json of older versions may carry settings since retired, e.g. cost_ratio)
        snap = {k: v for k, v in (data.get("snapshot") or {}).items() if k in known}
        snap["mode"] = SnapshotMode(snap.get("mode", "auto"))
        return cls(
            run_id=data["run_id"],
            source=data["source"],
            output=data.get("output"),
            parameters=data.get("parameters") or {},
            kernel_name=data["kernel_name"],
            cwd=data.get("cwd"),
            input_sha256=data["input_sha256"],
            limits=Limits(**(data.get("limits") or {})),
            snapshot=SnapshotPolicy(**snap),
            created=data.get("created", 0.0),
            hash_seed=data.get("hash_seed"),
            strict_resume=bool(data.get("strict_resume", False)),
            allow_errors=data.get("allow_errors") is True,
            nbclient=dict(data.get("nbclient") or {}),
        )


# nbclient's NotebookClient arguments execute_notebook passes through (papermill passes
# its extra keyword arguments to nbclient): name -> what the value must be
NBCLIENT_ARGS = {
    "iopub_timeout": "a number of seconds, zero or more",
    "extra_arguments": "a list of strings (the kernel's command-line arguments)",
    "record_timing": "True (spotbook always records cell times)",
    "store_widget_state": "True (spotbook always stores widget state)",
}


def check_nbclient_args(args: dict[str, Any]) -> None:
    """UsageError for an nbclient argument spotbook does not take, or a bad value."""
    for name, value in args.items():
        if name not in NBCLIENT_ARGS:
            raise UsageError(
                f"nbclient's {name!r} is not taken by spotbook; it takes "
                f"{', '.join(sorted(NBCLIENT_ARGS))}"
            )
        good = {
            "iopub_timeout": isinstance(value, int | float)
            and not isinstance(value, bool)
            and 0 <= value < math.inf,
            "extra_arguments": isinstance(value, list | tuple)
            and all(isinstance(a, str) for a in value),
            "record_timing": value is True,
            "store_widget_state": value is True,
        }[name]
        if not good:
            raise UsageError(f"nbclient's {name}={value!r}: give {NBCLIENT_ARGS[name]}")


# After a termination notice: how long saving (a snapshot in progress, or one last
# snapshot) may take, counted from the end of --grace. GKE gives a pod ~15 s of its
# 30 s notice: the default grace plus this fits.
SAVE_BUDGET = 6.0
# Past grace plus the save budget, something below spotbook is stuck (a store that does
# not answer, a client library's own retries): the exit watchdog ends the process this
# long after that, keeping what was committed.
EXIT_MARGIN = 2.0

# Exit codes: DESIGN.md's contract between the runner and the Job controller.
EXIT_OK = 0
EXIT_CELL_ERROR = 1  # a cell raised: it will fail again
EXIT_USAGE = 2  # bad usage, input notebook or parameters
EXIT_STORAGE = 3  # storage or infrastructure: may pass on retry
EXIT_TIMEOUT = 4  # a cell or the whole run took too long
EXIT_BUDGET = 5  # preemption budget exhausted
EXIT_RESUME_REFUSED = 6  # --strict-resume: the resumed run could differ from an uninterrupted one
EXIT_STOPPED = 75  # stopped on SIGTERM after saving progress
# the kernel died in a cell, a snapshot or a restore (before any notice): papermill's
# code for a dead kernel, so scripts written for papermill keep telling it apart
EXIT_KERNEL_DIED = 138
# What a retry cannot fix: the Job's podFailurePolicy fails the Job on these at once.
EXIT_CODES_FAIL_JOB = frozenset(
    {
        EXIT_CELL_ERROR,
        EXIT_USAGE,
        EXIT_TIMEOUT,
        EXIT_BUDGET,
        EXIT_RESUME_REFUSED,
        EXIT_KERNEL_DIED,
    }
)


@dataclass(frozen=True)
class RunRequest:
    """One run as asked for, by a command's flags or a library call's arguments: made
    once, checked on making (limits, snapshot policy and nbclient's arguments check
    themselves), then passed down whole to ``prepare``, ``submit`` and a sweep's points
    (whose ``output`` may be a template, ``out_{lr}.ipynb``). ``notebook`` is a path or URL,
    or a notebook object; ``output`` None keeps the result in the run store only."""

    notebook: Any
    output: str | os.PathLike[str] | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    kernel_name: str | None = None
    language: str | None = None
    report_mode: bool = False
    cwd: str | None = None
    limits: Limits = field(default_factory=Limits)
    snapshot: SnapshotPolicy = field(default_factory=SnapshotPolicy)
    run_dir: str | None = None
    restart: bool = False
    strict_resume: bool = False
    allow_errors: bool = False
    prepare_only: bool = False  # freeze the notebook with its parameters; never run it
    nbclient: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_nbclient_args(self.nbclient)


def epoch(stamp: str | None) -> float | None:
    """Seconds since the epoch of a Kubernetes timestamp (RFC 3339), or None."""
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting to be reaped does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
