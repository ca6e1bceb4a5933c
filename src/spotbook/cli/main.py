"""The ``spotbook`` command. The only place that prints and maps errors to exit codes."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

from .. import __version__
from .._api import inspect_notebook, notebook_parameters, outputs_to, prepare_run
from .._errors import (
    CellError,
    ExecutionTimeoutError,
    KernelDiedError,
    PreemptionBudgetError,
    ResumeRefusedError,
    RunNotFoundError,
    SpotbookError,
    StorageError,
    StoreIntegrityError,
    SupersededError,
    Terminated,
    UsageError,
)
from .._models import (
    EXIT_BUDGET,
    EXIT_CELL_ERROR,
    EXIT_KERNEL_DIED,
    EXIT_RESUME_REFUSED,
    EXIT_STOPPED,
    EXIT_STORAGE,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    Limits,
    SnapshotPolicy,
)
from .._status import ClusterView, describe, local_runs
from ..attempt.progress import ProgressBar
from ..attempt.runner import Runner, RunnerOptions
from ..kube.jobs import CANCELLED, JOB_RECORD
from ..kube.manifest import ANNOTATION_RUN_DIR
from ..notebook.parameters import Parameter, collect_parameters
from ..store.runstore import RunStore, is_url, resolve_run

log = logging.getLogger("spotbook")

# DESIGN.md's contract with the Job controller; most specific class first.
EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (Terminated, EXIT_STOPPED),
    (PreemptionBudgetError, EXIT_BUDGET),
    (ExecutionTimeoutError, EXIT_TIMEOUT),
    (StorageError, EXIT_STORAGE),
    (SupersededError, EXIT_STORAGE),
    (ResumeRefusedError, EXIT_RESUME_REFUSED),
    (StoreIntegrityError, EXIT_USAGE),
    (UsageError, EXIT_USAGE),
    (KernelDiedError, EXIT_KERNEL_DIED),
    (CellError, EXIT_CELL_ERROR),
)


def exit_code(exc: BaseException) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_STORAGE


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    """papermill's flags, same names and meaning, plus spotbook's own."""
    _add_parameter_flags(p, "where to write the result; - for stdout")
    _add_execution_flags(p)


def _add_parameter_flags(p: argparse.ArgumentParser, output_help: str) -> None:
    p.add_argument("input", metavar="INPUT", help="notebook path or fsspec URL; - for stdin")
    p.add_argument("output", metavar="OUTPUT", nargs="?", help=output_help)
    g = p.add_argument_group("parameters (as papermill)")
    g.add_argument(
        "-p",
        "--parameters",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="typed: ints, floats, True/False/None",
    )
    g.add_argument(
        "-r",
        "--parameters_raw",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="kept as a string",
    )
    g.add_argument("-y", "--parameters_yaml", action="append", default=[], metavar="YAML")
    g.add_argument("-f", "--parameters_file", action="append", default=[], metavar="FILE")
    g.add_argument(
        "-b", "--parameters_base64", action="append", default=[], metavar="B64", help="YAML"
    )
    g.add_argument("--inject-input-path", action="store_true", help="PAPERMILL_INPUT_PATH = INPUT")
    g.add_argument(
        "--inject-output-path", action="store_true", help="PAPERMILL_OUTPUT_PATH = OUTPUT"
    )
    g.add_argument("--inject-paths", action="store_true", help="both of the above")


def _add_execution_flags(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("execution (as papermill)")
    e.add_argument("-k", "--kernel", help="kernel name (default: the notebook's)")
    e.add_argument("-l", "--language", help="the notebook's language (spotbook: python)")
    e.add_argument("--engine", help="execution engine (spotbook's own: nbclient)")
    e.add_argument("--cwd", help="working directory of the kernel")
    e.add_argument(
        "--log-output",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="echo cell output to stderr",
    )
    e.add_argument("--stdout-file", metavar="FILE", help="write the cells' stdout to FILE")
    e.add_argument("--stderr-file", metavar="FILE", help="write the cells' stderr to FILE")
    e.add_argument(
        "--report-mode",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="hide the code cells' input in the output notebook",
    )
    e.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        help="tqdm's bar on stderr, as papermill draws it (default: on unless --log-output)",
    )
    e.add_argument("--execution-timeout", type=float, metavar="S", help="limit per cell")
    e.add_argument("--start-timeout", "--start_timeout", type=float, default=60.0, metavar="S")
    e.add_argument(
        "--autosave-cell-every",
        type=int,
        default=30,
        metavar="S",
        help="accepted for papermill compatibility; progress is saved after every cell",
    )
    e.add_argument(
        "--prepare-only",
        action="store_true",
        help="write the parameterised notebook without running it",
    )
    e.add_argument(
        "--help-notebook",
        action="store_true",
        help="show the notebook's parameters (as `spotbook inspect`) and exit",
    )
    e.add_argument(
        "--request-save-on-cell-execute",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="accepted for papermill compatibility; progress is always saved per cell",
    )
    s = p.add_argument_group("spotbook")
    s.add_argument("--run-dir", metavar="URL", help="run store (default .spotbook/runs/ID)")
    s.add_argument("--timeout", type=float, metavar="S", help="limit for the whole run")
    s.add_argument(
        "--snapshot",
        default="auto",
        metavar="MODE",
        help="kernel-state snapshots: every-cell, auto (cost-aware), off",
    )
    s.add_argument(
        "--snapshot-interval",
        type=float,
        metavar="S",
        help="with auto: also snapshot after this much compute",
    )
    s.add_argument(
        "--max-preemptions",
        type=int,
        metavar="N",
        help="stop with exit 5 after N preemptions (submit: default 20)",
    )
    s.add_argument(
        "--strict-resume",
        action="store_true",
        help="refuse to resume (exit 6) when the resumed run could differ from an "
        "uninterrupted one; the fidelity report in `spotbook status` says what",
    )
    s.add_argument(
        "--max-output-bytes",
        type=int,
        default=Limits().max_output_bytes,
        metavar="N",
        help="stream text kept per cell in the notebook",
    )
    s.add_argument(
        "--checkpoint-interval",
        type=float,
        default=Limits().checkpoint_interval,
        metavar="S",
        help="object-store runs: sync spotbook.checkpoint_dir() to the store this often",
    )
    s.add_argument(
        "--restart", action="store_true", help="discard what --run-dir holds and start over"
    )
    _add_common(p)


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster (as kubectl)")
    g.add_argument("--context", metavar="NAME", help="kubeconfig context (default: current)")
    g.add_argument("-n", "--namespace", metavar="NS", help="default: the context's namespace")


def _add_submit_flags(p: argparse.ArgumentParser) -> None:
    from ..kube.manifest import DEFAULT_BACKOFF, PROVIDERS

    _add_cluster_flags(p)
    k = p.add_argument_group("the Job")
    k.add_argument("--image", required=True, help="container image with spotbook installed")
    k.add_argument("--gpu", metavar="TYPE[:COUNT]", help="e.g. nvidia-l4, nvidia-l4:2, or 1")
    k.add_argument("--cpu", metavar="CPU", help="CPU request, e.g. 4 or 500m")
    k.add_argument("--memory", metavar="MEM", help="memory request and limit, e.g. 16Gi")
    k.add_argument(
        "--spot",
        dest="spot",
        action="store_true",
        default=True,
        help="run on spot/preemptible nodes (default)",
    )
    k.add_argument("--on-demand", dest="spot", action="store_false", help="run on regular nodes")
    k.add_argument(
        "--provider",
        default="gke",
        choices=sorted(PROVIDERS),
        help="whose spot and GPU node labels to use (default gke)",
    )
    k.add_argument(
        "--service-account",
        metavar="NAME",
        help="Kubernetes service account (workload identity for the bucket)",
    )
    k.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for the pod; its value is in the Job spec in plain text",
    )
    k.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="NAME=SECRET:KEY",
        help="a variable whose value is item KEY of Kubernetes Secret SECRET (secretKeyRef)",
    )
    k.add_argument(
        "--env-from-secret",
        action="append",
        default=[],
        metavar="SECRET",
        help="every item of Kubernetes Secret SECRET as a variable (envFrom)",
    )
    k.add_argument(
        "--key-secret",
        default=None,
        metavar="NAME",
        help="the Secret holding the run key, created from this machine's key if missing "
        "(default spotbook-run-key)",
    )
    k.add_argument(
        "--queue",
        metavar="NAME",
        help="Kueue LocalQueue: the Job is created suspended and Kueue starts it on admission",
    )
    k.add_argument(
        "--ttl",
        default="7d",
        metavar="DURATION",
        help="delete the finished Job after this long (default 7d)",
    )
    k.add_argument("--deadline", metavar="DURATION", help="activeDeadlineSeconds, e.g. 12h")
    k.add_argument(
        "--backoff-limit",
        type=int,
        default=DEFAULT_BACKOFF,
        metavar="N",
        help="infrastructure failures to retry (preemptions are not counted)",
    )
    k.add_argument("--dry-run", action="store_true", help="print the manifest, submit nothing")
    k.add_argument("-o", "--output-format", choices=["yaml", "json"], default="yaml")
    k.add_argument(
        "--wait", action="store_true", help="follow the Job until it ends; exit with the run's code"
    )


def _add_plan_flags(p: argparse.ArgumentParser, provider: str) -> None:
    from ..kube.gpus import DEFAULT_GPU
    from ..kube.plans import KSA_DEFAULT

    if provider == "gke":
        p.add_argument("--project", help="Google Cloud project")
        where = p.add_mutually_exclusive_group()
        where.add_argument("--zone", dest="location", help="e.g. us-central1-a (zonal cluster)")
        where.add_argument("--region", dest="location", help="e.g. us-central1 (regional)")
    elif provider == "eks":
        p.add_argument("--region", dest="location", help="AWS region, e.g. us-west-2")
    else:
        p.add_argument("--resource-group", dest="project", help="Azure resource group")
        p.add_argument("--location", help="Azure region, e.g. eastus")
    p.add_argument("--cluster", default="spotbook", help="cluster name (default spotbook)")
    default_gpu = DEFAULT_GPU[provider]
    p.add_argument(
        "--gpu",
        default=default_gpu,
        metavar="TYPE[:COUNT]",
        help=f"GPU type and count per node (default {default_gpu}; COUNT alone keeps it)",
    )
    p.add_argument(
        "--machine-type",
        help="GPU node machine type (default: the one that carries COUNT of the GPU type)",
    )
    if provider == "gke":
        p.add_argument(
            "--node-locations",
            metavar="ZONE[,ZONE...]",
            help="regional clusters: the zones the GPU pool uses (zones that offer the GPU)",
        )
    p.add_argument(
        "--registry",
        metavar="NAME",
        help="the image repository the plan creates (default spotbook; on AKS the "
        "registry's name, default made from --cluster and --bucket)",
    )
    p.add_argument("--system-machine-type", help="system pool machine type")
    p.add_argument("--max-nodes", type=int, default=4, help="GPU pool autoscaling limit")
    p.add_argument("--bucket", help="bucket (storage account on AKS) for run stores")
    p.add_argument("--namespace", default="default", help="where runs' pods go")
    p.add_argument("--service-account", default=KSA_DEFAULT, help="the pods' service account")
    p.add_argument("-o", "--output-format", choices=["text", "json"], default="text")
    if provider == "gke":
        p.add_argument("--yes", action="store_true", help="up/down: run without asking")
        p.add_argument(
            "--from",
            dest="start",
            type=int,
            default=1,
            metavar="N",
            help="up/down: start at step N (after fixing a failed step)",
        )
        p.add_argument(
            "--delete-bucket",
            action="store_true",
            help="down: also delete the bucket and every run in it",
        )


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--grace",
        type=float,
        metavar="S",
        help=f"on SIGTERM, how long the running cell may take to finish (default "
        f"{Limits().grace:g}, or what the run was started with)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spotbook",
        description="Run notebooks as batch jobs that survive preemption.",
    )
    parser.add_argument("--version", action="version", version=f"spotbook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a notebook (papermill's flags), saving progress")
    _add_run_flags(run)
    ins = sub.add_parser(
        "inspect",
        help="the notebook's parameters: names, types, defaults, help (papermill's "
        "--help-notebook)",
        description="List the parameters the cell tagged 'parameters' assigns: name, type "
        "(an annotation or a '# type:' comment), default and the help comment that ends the "
        "line. -p/-r/-y/-f/-b fill a templated INPUT path, as papermill does.",
    )
    _add_parameter_flags(ins, "accepted for papermill's argument order; not used")
    ins.add_argument("--json", action="store_true", help="papermill's inspect_notebook dict")
    res = sub.add_parser("resume", help="continue a killed run after its last saved cell")
    res.add_argument("run", metavar="RUN", help="run id or run store URL")
    res.add_argument("--log-output", action="store_true")
    res.add_argument(
        "--strict-resume",
        action="store_true",
        help="refuse (exit 6) when the resumed run could differ from an uninterrupted one",
    )
    res.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        help="tqdm's bar on stderr (default: on unless --log-output)",
    )
    _add_common(res)
    st = sub.add_parser("status", help="where a run stands (store, and cluster if submitted)")
    st.add_argument("run", metavar="RUN", help="run id or run store URL")
    st.add_argument("--json", action="store_true", help="machine-readable")
    sb = sub.add_parser(
        "submit",
        help="run a notebook as a Kubernetes Job on spot (GPU) nodes",
        description="Freeze the notebook into --run-dir (a bucket URL) and create a Job "
        "that runs it with `spotbook worker`; preemptions resume after the last saved cell.",
    )
    _add_run_flags(sb)
    _add_submit_flags(sb)
    st = sub.choices["status"]
    _add_cluster_flags(st)
    lg = sub.add_parser("logs", help="the output of a submitted run's pod (kubectl logs)")
    lg.add_argument("run", metavar="RUN", help="run id or run store URL")
    lg.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    lg.add_argument("--all", action="store_true", help="every attempt's pod, oldest first")
    _add_cluster_flags(lg)
    cn = sub.add_parser("cancel", help="stop a submitted run: delete its Job (progress is kept)")
    cn.add_argument("run", metavar="RUN", help="run id or run store URL")
    _add_cluster_flags(cn)
    rc = sub.add_parser(
        "recover",
        help="a submitted run whose pod is stuck Terminating on a dead node: delete that "
        "pod (grace 0) so the Job starts a replacement",
    )
    rc.add_argument("run", metavar="RUN", help="run id or run store URL")
    _add_cluster_flags(rc)
    dr = sub.add_parser(
        "drill",
        help="preempt a running run on purpose and report how it recovered",
        description="Local runs: SIGTERM to the runner (SIGKILL after its grace), then "
        "resume here. Submitted runs: evict the pod through the Eviction API (as a drain or "
        "the autoscaler would), or on GKE simulate a maintenance event on its node; then "
        "follow the run until it runs new cells again and print the downtime report.",
    )
    dr.add_argument("run", metavar="RUN", help="run id or run store URL")
    dr.add_argument(
        "--how",
        choices=["evict", "maintenance"],
        default="evict",
        help="submitted runs: Eviction API (any cluster) or GKE maintenance event",
    )
    dr.add_argument(
        "--yes",
        action="store_true",
        help="maintenance: run the gcloud command instead of printing it",
    )
    dr.add_argument("--no-resume", action="store_true", help="local runs: only stop it")
    dr.add_argument(
        "--timeout", type=float, default=1800.0, metavar="S", help="how long to follow the recovery"
    )
    dr.add_argument("--log-output", action="store_true")
    dr.add_argument("--progress-bar", action=argparse.BooleanOptionalAction, default=False)
    _add_cluster_flags(dr)
    _add_common(dr)
    for provider, verbs in (
        ("gke", ("plan", "up", "down")),
        ("eks", ("plan",)),
        ("aks", ("plan",)),
    ):
        pp = sub.add_parser(provider, help=f"{provider.upper()} cluster setup for spot GPU runs")
        pp.add_argument("verb", choices=verbs, help="plan: print the commands; up/down: run them")
        _add_plan_flags(pp, provider)
    runs = sub.add_parser("runs", help="list runs: local ones, or the cluster's with --cluster")
    runs.add_argument("--cluster", action="store_true", help="list the Jobs spotbook made")
    runs.add_argument("-A", "--all-namespaces", action="store_true")
    _add_cluster_flags(runs)
    wk = sub.add_parser(
        "worker",
        help="the container entrypoint: run or resume the run in SPOTBOOK_RUN_DIR",
        description="Run one attempt of a run, as a container does: the run store comes "
        "from --run-dir or SPOTBOOK_RUN_DIR, or from the classic BUCKET_NAME / "
        "DOWNLOAD_FILE_PATH / UPLOAD_FILE_PATH variables. Exits with DESIGN.md's codes.",
    )
    wk.add_argument("--run-dir", metavar="URL", help="run store (default $SPOTBOOK_RUN_DIR)")
    wk.add_argument(
        "--log-output",
        action=argparse.BooleanOptionalAction,
        default=os.environ.get("SPOTBOOK_LOG_OUTPUT", "1") not in ("0", "false", ""),
        help="echo cell output to stderr, for the pod's log (default on)",
    )
    wk.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="draw the progress bar on stderr (default off: a pod's log is not a terminal)",
    )
    _add_common(wk)
    return parser


def _echo_output(kind: str, content: dict[str, Any]) -> None:
    text = content.get("text") or (content.get("data") or {}).get("text/plain", "")
    if kind == "error":
        text = f"{content.get('ename')}: {content.get('evalue')}\n"
    if text:
        sys.stderr.write(text if str(text).endswith("\n") else f"{text}\n")
        sys.stderr.flush()


def _exit_now(why: str) -> None:
    """The runner's exit watchdog: the time to exit after a notice ran out."""
    print(f"spotbook: {why}", file=sys.stderr, flush=True)
    logging.shutdown()
    os._exit(EXIT_STOPPED)


def _stream_files(args: argparse.Namespace) -> Any:
    """(on_output, files to close): --log-output to stderr, --stdout-file/--stderr-file."""
    files = {
        name: open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by the caller
        for name, path in (
            ("stdout", getattr(args, "stdout_file", None)),
            ("stderr", getattr(args, "stderr_file", None)),
        )
        if path
    }
    echo = _echo_output if args.log_output else None
    return outputs_to(echo, files.get("stdout"), files.get("stderr")), list(files.values())


def _run_runner(store: RunStore, args: argparse.Namespace) -> int:
    on_output, files = _stream_files(args)
    opts = RunnerOptions(
        grace=args.grace,
        strict_resume=bool(getattr(args, "strict_resume", False)),
        on_output=on_output,
        progress=ProgressBar(
            not args.log_output if args.progress_bar is None else args.progress_bar,
            describe_cells=not args.log_output,
        ),
        on_overrun=_exit_now,
    )
    try:
        result = Runner(store, opts).run()
    finally:
        for fh in files:
            fh.close()
    output = store.require_run()["spec"].get("output") or f"{result.url}/output.ipynb"
    print(
        f"spotbook: run {result.run_id} {result.status.value}: "
        f"{result.cells_done}/{result.cells_total} cells; output in {output}",
        file=sys.stderr,
    )
    return 0


def _limits(args: argparse.Namespace) -> Limits:
    return Limits(
        execution_timeout=args.execution_timeout,
        run_timeout=args.timeout,
        start_timeout=args.start_timeout,
        grace=Limits().grace if args.grace is None else args.grace,
        max_preemptions=args.max_preemptions,
        max_output_bytes=args.max_output_bytes,
        checkpoint_interval=args.checkpoint_interval,
    )


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    """The parameters, merged as papermill merges them: the injected paths, -b, -f, -y,
    -p, -r."""
    paths = {}
    if args.inject_input_path or args.inject_paths:
        paths["PAPERMILL_INPUT_PATH"] = args.input
    if args.inject_output_path or args.inject_paths:
        paths["PAPERMILL_OUTPUT_PATH"] = args.output or "-"
    return collect_parameters(
        paths=paths,
        base64_yaml=args.parameters_base64,
        files=args.parameters_file,
        yaml_strings=args.parameters_yaml,
        typed=[tuple(p) for p in args.parameters],
        raw=[tuple(p) for p in args.parameters_raw],
    )


def _check_engine(args: argparse.Namespace) -> None:
    if args.engine not in (None, "nbclient", "spotbook"):
        raise UsageError(
            f"--engine {args.engine}: spotbook runs notebooks with its own engine (nbclient "
            "underneath); leave --engine out"
        )
    if args.language not in (None, "python") and not getattr(args, "prepare_only", False):
        raise UsageError(
            f"--language {args.language}: spotbook runs Python notebooks only (it restores a "
            "Python kernel's state); --prepare-only writes the notebook with its parameters "
            "in that language without running it"
        )


def _stdin_notebook(args: argparse.Namespace) -> Any:
    """INPUT, or the notebook read from stdin for ``-``."""
    if args.input != "-":
        return args.input
    data = sys.stdin.buffer.read()
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise UsageError(f"stdin (INPUT -) is not a notebook: {exc}") from exc
    if not isinstance(doc, dict):
        raise UsageError("stdin (INPUT -) is not a notebook: not a JSON object")
    return doc


def _prepare(args: argparse.Namespace, key: Any = None, here: bool = True) -> RunStore:
    """Freeze the parameterised notebook into its run store (run and submit)."""
    _check_engine(args)
    return prepare_run(
        _stdin_notebook(args),
        None if args.output == "-" else args.output,
        parameters=_parameters(args),
        report_mode=args.report_mode,
        language=args.language,
        prepare_only=bool(getattr(args, "prepare_only", False)),
        kernel_name=args.kernel,
        cwd=args.cwd,
        limits=_limits(args),
        snapshot=SnapshotPolicy.parse(args.snapshot, args.snapshot_interval),
        run_dir=args.run_dir,
        restart=args.restart,
        strict_resume=args.strict_resume,
        key=key,
        here=here,
    )


def _show_parameters(where: str, found: list[Parameter] | None) -> None:
    """papermill's --help-notebook listing: name, type, default, and the help comment
    in a column of its own."""
    print(f"Parameters inferred for notebook '{where}':")
    if found is None:
        print("  No cell tagged 'parameters'")
    elif not found:
        print("  No parameters assigned in the cell tagged 'parameters'")
    for p in found or []:
        head = f"  {p.name}: {p.shown_type()} (default {p.default})"
        if not p.help:
            print(head)
        elif len(head) < 34:
            print(f"{head:<34}{p.help}")
        else:
            print(f"{head}\n{'':<34}{p.help}")


def _cmd_inspect(args: argparse.Namespace) -> int:
    params = _parameters(args)
    if args.json:
        print(json.dumps(inspect_notebook(_stdin_notebook(args), params), indent=2))
        return 0
    _show_parameters(args.input, notebook_parameters(_stdin_notebook(args), params))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    if args.help_notebook:
        _check_engine(args)
        _show_parameters(args.input, notebook_parameters(_stdin_notebook(args), _parameters(args)))
        return 0
    store = _prepare(args)
    run_id = store.require_run()["spec"]["run_id"]
    print(f"spotbook: run {run_id}, store {store.url}", file=sys.stderr)
    if args.prepare_only:
        data = store.read("input.ipynb")
        output = store.require_run()["spec"].get("output")
        if args.output == "-" and data is not None:
            sys.stdout.write(data.decode())
        elif output and data is not None:
            from ..store.runstore import write_url

            write_url(output, data)
        return 0
    if args.output != "-":
        return _run_runner(store, args)
    try:  # OUTPUT -: the notebook goes to stdout, also when a cell failed
        return _run_runner(store, args)
    finally:
        data = store.read("output.ipynb")
        if data is not None:
            sys.stdout.write(data.decode())
            sys.stdout.flush()


def _cmd_resume(args: argparse.Namespace) -> int:
    store = RunStore(resolve_run(args.run))
    store.require_run()
    print(f"spotbook: resuming {store.url}", file=sys.stderr)
    return _run_runner(store, args)


def _cmd_worker(args: argparse.Namespace) -> int:
    from .._worker import open_target, resolve_target

    if os.environ.get("KUBERNETES_SERVICE_HOST") and not (
        os.environ.get("SPOTBOOK_SNAPSHOT_KEY") or os.environ.get("SPOTBOOK_SNAPSHOT_KEY_FILE")
    ):
        # a key made in this pod's home would die with the pod: the next pod could not
        # check the store, and every preemption would end the run
        raise UsageError(
            "spotbook worker in a pod needs the run key from a Kubernetes Secret: create "
            "one (`kubectl create secret generic spotbook-run-key --from-literal=key=$(openssl "
            "rand -hex 32)`), mount it and set SPOTBOOK_SNAPSHOT_KEY_FILE to the file "
            "(`spotbook submit` does this itself; see docs/kubernetes.md)"
        )
    target = resolve_target(args.run_dir, os.environ)
    store = open_target(target)
    if store.exists(CANCELLED):
        raise UsageError(f"run in {store.url} was cancelled (`spotbook cancel`); not starting it")
    print(f"spotbook: worker for {store.url}", file=sys.stderr)
    return _run_runner(store, args)


def _cluster_for(args: argparse.Namespace, record: dict[str, Any] | None = None) -> Any:
    from ..kube.cluster import Cluster

    record = record or {}
    return Cluster(
        context=args.context or record.get("context"),
        namespace=args.namespace or record.get("namespace"),
    )


def _open_run(args: argparse.Namespace) -> RunStore:
    """The run store of RUN: a URL, a local run, or (by id) a Job on the cluster."""
    store = RunStore(resolve_run(args.run))
    if store.exists("run.json") or is_url(args.run) or os.sep in args.run:
        return store
    try:
        cluster = _cluster_for(args)
    except UsageError:
        return store  # no cluster configured: report the local lookup's failure
    job = cluster.get_job(args.run)
    url = ((job or {}).get("metadata", {}).get("annotations") or {}).get(ANNOTATION_RUN_DIR)
    if not url:
        raise RunNotFoundError(
            f"no run {args.run!r} under ./.spotbook/runs nor as a Job in namespace "
            f"{cluster.namespace!r}; give the run store URL, or --namespace/--context"
        )
    return RunStore(url)


def _job_record(store: RunStore) -> dict[str, Any]:
    record = store.read_json(JOB_RECORD)
    if record is None:
        raise UsageError(
            f"the run in {store.url} was not submitted to a cluster; its notebook is in "
            f"{store.url}/output.ipynb (`spotbook status {store.url}`)"
        )
    assert isinstance(record, dict)
    return record


def _cmd_submit(args: argparse.Namespace) -> int:
    from ..kube.manifest import (
        DEFAULT_KEY_SECRET,
        DEFAULT_MAX_PREEMPTIONS,
        JobOptions,
        build_job,
        parse_duration,
        parse_env,
        parse_gpu,
        parse_secret_env,
        secret_looking,
    )
    from ..store.integrity import load_key

    if not args.run_dir or not is_url(args.run_dir):
        raise UsageError(
            "spotbook submit needs --run-dir URL in a bucket the pods can reach "
            "(gs://BUCKET/runs/NAME, s3://..., az://...): a pod cannot see this machine's disk"
        )
    if args.output and not is_url(args.output):
        raise UsageError(
            f"OUTPUT {args.output!r} is a local path, which the pod cannot write; give a "
            "bucket URL, or leave it out and download RUN_DIR/output.ipynb"
        )
    if args.cwd:
        raise UsageError("--cwd is a path on this machine; it has no meaning in the pod")
    if args.prepare_only:
        raise UsageError("--prepare-only does not apply to submit; use --dry-run to see the Job")
    if args.stdout_file or args.stderr_file:
        raise UsageError(
            "--stdout-file/--stderr-file are files on this machine; a submitted run's output "
            "is in its pod's log (`spotbook logs -f RUN`)"
        )
    gpu_type, gpu_count = parse_gpu(args.gpu)
    if args.max_preemptions is None:
        args.max_preemptions = DEFAULT_MAX_PREEMPTIONS
    job_kwargs: dict[str, Any] = {
        "run_dir": args.run_dir.rstrip("/"),
        "image": args.image,
        "provider": args.provider,
        "spot": args.spot,
        "gpu_type": gpu_type,
        "gpu_count": gpu_count,
        "cpu": args.cpu,
        "memory": args.memory,
        "service_account": args.service_account,
        "env": parse_env(args.env),
        "secret_env": parse_secret_env(args.secret_env),
        "env_from_secrets": tuple(args.env_from_secret),
        "key_secret": args.key_secret or DEFAULT_KEY_SECRET,
        "queue": args.queue,
        "ttl_seconds": parse_duration(args.ttl, "--ttl"),
        "deadline_seconds": parse_duration(args.deadline, "--deadline") if args.deadline else None,
        "backoff_limit": args.backoff_limit,
        "grace": _limits(args).grace,
        "source": args.input,
    }
    if args.backoff_limit < 0:
        raise UsageError("--backoff-limit must be zero or more")
    for name in secret_looking([n for n, _ in job_kwargs["env"]]):
        print(
            f"spotbook: warning: --env {name}=... puts its value in the Job spec in plain "
            "text (anyone who can read Jobs, and the cluster's audit log, sees it); keep it "
            "in a Kubernetes Secret and pass --secret-env "
            f"{name}=SECRET:KEY or --env-from-secret SECRET",
            file=sys.stderr,
        )
    if not args.memory:
        print(
            "spotbook: warning: no --memory: a notebook that runs out of its node's memory "
            "is evicted, which counts as a preemption, and runs again on a fresh node (up "
            f"to --max-preemptions, {args.max_preemptions} times); give --memory, e.g. 16Gi",
            file=sys.stderr,
        )
    if args.dry_run:
        from ..notebook import document as nbs
        from ..store.runstore import new_run_id, read_url

        nbs.inject_parameters(
            nbs.parse(read_url(args.input), repr(args.input)),
            _parameters(args),
            args.kernel,
            args.language,
        )
        _limits(args)
        manifest = build_job(
            JobOptions(run_id=new_run_id(), namespace=args.namespace or "default", **job_kwargs)
        )
        _print_manifest(manifest, args.output_format)
        return 0
    cluster = _cluster_for(args)  # before anything is written: fail early on bad config
    JobOptions(run_id="check", namespace=cluster.namespace, **job_kwargs)  # validate early
    # The pod checks the store with the key in the Secret: seal the run with that key.
    key = cluster.run_key(job_kwargs["key_secret"], load_key())
    store = _prepare(args, key, here=False)
    run_id = store.require_run()["spec"]["run_id"]
    manifest = build_job(JobOptions(run_id=run_id, namespace=cluster.namespace, **job_kwargs))
    name = manifest["metadata"]["name"]
    store.write_json(
        JOB_RECORD,
        {
            "context": cluster.context_name,
            "server": cluster.server,
            "namespace": cluster.namespace,
            "job": name,
            "provider": args.provider,
            "image": args.image,
            "gpu_count": gpu_count,
            "submitted": time.time(),
        },
    )
    cluster.create_job(manifest)
    print(
        f"spotbook: submitted run {run_id} as Job {name} in namespace {cluster.namespace} "
        f"(context {cluster.context_name}); store {store.url}\n"
        f"  spotbook status {store.url}\n  spotbook logs -f {store.url}\n"
        f"  spotbook cancel {store.url}",
        file=sys.stderr,
    )
    if not args.wait:
        return 0
    return _follow(cluster, store, run_id)


def _print_manifest(manifest: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(manifest, indent=2))
    else:
        import yaml

        class _NoAliases(yaml.SafeDumper):
            # a reviewer reads each value where it applies, not an anchor (&id001)
            def ignore_aliases(self, data: Any) -> bool:
                return True

        print(yaml.dump(manifest, Dumper=_NoAliases, sort_keys=False), end="")


def _follow(cluster: Any, store: RunStore, run_id: str) -> int:
    from ..kube.jobs import follow, job_view

    def say(line: str) -> None:
        print(f"spotbook: {line}", file=sys.stderr, flush=True)

    code = follow(
        lambda: job_view(cluster.get_job(run_id), cluster.pods(run_id), cluster.node_ready),
        lambda: cluster.watch_job(run_id),
        say,
    )
    doc = describe(store)
    say(f"run {run_id} {doc['status']}: {doc['cells_done']}/{doc['cells_total']} cells")
    return int(code)


def _cluster_view(args: argparse.Namespace, cluster: Any = None) -> ClusterView:
    """``describe``'s window on the cluster: the Job and its pods, or the error that
    kept them from view; through ``cluster`` when the caller holds one."""
    from ..kube.cluster import ClusterError
    from ..kube.jobs import job_view

    def view(run_id: str, record: dict[str, Any]) -> dict[str, Any]:
        try:
            client = cluster or _cluster_for(args, record)
            return job_view(client.get_job(run_id), client.pods(run_id), client.node_ready)
        except (ClusterError, UsageError) as exc:
            return {"error": str(exc)}

    return view


def _cmd_logs(args: argparse.Namespace) -> int:
    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    pods = cluster.pods(run_id)
    if args.follow:
        deadline = time.monotonic() + 600
        told = False
        while (not pods or pods[-1].get("status", {}).get("phase") == "Pending") and (
            time.monotonic() < deadline
        ):
            if not told:
                print("spotbook: waiting for the run's pod to start", file=sys.stderr)
                told = True
            time.sleep(2.0)
            pods = cluster.pods(run_id)
    if not pods:
        print(
            f"spotbook: run {run_id} has no pods (not started yet, or removed after the Job "
            f"finished); its notebook is in {store.url}/output.ipynb",
            file=sys.stderr,
        )
        return 0
    targets = pods if args.all else pods[-1:]
    for pod in targets:
        name = pod["metadata"]["name"]
        if args.all:
            print(f"==> pod {name} <==", flush=True)
        for line in cluster.logs(name, follow=args.follow and pod is pods[-1]):
            sys.stdout.write(line if line.endswith("\n") else line + "\n")
            sys.stdout.flush()
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    from ..kube.cluster import ClusterError

    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    if cluster.get_job(run_id) is None:
        raise ClusterError(
            f"run {run_id} has no Job in namespace {cluster.namespace!r}: it has finished and "
            "been cleaned up, or was cancelled already"
        )
    store.write_json(CANCELLED, {"at": time.time(), "by": os.environ.get("USER", "")})
    cluster.delete_job(run_id)
    print(
        f"spotbook: cancelled run {run_id}: deleted its Job; the pod saves progress on its "
        f"way out, and {store.url} keeps everything done so far",
        file=sys.stderr,
    )
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    from ..kube.jobs import describe_pod, pod_view

    store = _open_run(args)
    run_id = store.require_run()["spec"]["run_id"]
    cluster = _cluster_for(args, _job_record(store))
    views = [pod_view(p, cluster.node_ready) for p in cluster.pods(run_id)]
    # stuck on a node that is not Ready, or past its grace on one this account may not read
    stuck = [v for v in views if v.get("past_grace")]
    if not stuck:
        states = "; ".join(describe_pod(v) for v in views) or "no pods"
        print(f"spotbook: run {run_id} has no stuck pod ({states}); nothing done", file=sys.stderr)
        return 0
    for v in stuck:
        # The old attempt cannot write once a new one claims the run (the store's fence),
        # so forgetting a pod whose node died is safe even if that node comes back.
        cluster.force_delete_pod(v["name"])
        print(
            f"spotbook: deleted pod {v['name']} (Terminating past its grace on {v['node']}) "
            "with grace 0; the Job starts a replacement, which resumes the run",
            file=sys.stderr,
        )
    return 0


def _when(ts: float | None) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _cmd_status(args: argparse.Namespace) -> int:
    store = _open_run(args)
    doc = describe(store, cluster=_cluster_view(args))
    view = doc.get("cluster")
    if view:
        live = view.get("state")
        if doc["status"] in ("pending", "running", "interrupted") and live in (
            "pending",
            "queued",
            "retrying",
            "running",
        ):
            doc["status"] = live
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"run      {doc['run_id']}  ({doc['run_dir']})")
    print(f"status   {doc['status']}" + (f": {doc['message']}" if doc["message"] else ""))
    print(f"cells    {doc['cells_done']}/{doc['cells_total']} done")
    if doc["failing_cell"]:
        f = doc["failing_cell"]
        print(f"failed   cell {f['index']}: {f.get('ename')}: {f.get('evalue')}")
    cluster = doc.get("cluster")
    if cluster and "error" in cluster:
        print(f"cluster  unknown: {cluster['error']}")
    elif cluster:
        where = (
            f"Job {cluster.get('job')} in {cluster.get('namespace')}"
            if "job" in cluster
            else ("its Job is gone (finished and cleaned up, or cancelled)")
        )
        print(
            f"cluster  {cluster['state']}: {where}, {cluster.get('preemptions', 0)} preempted pods"
        )
        if cluster.get("reason"):
            why = cluster["reason"] + (f": {cluster['message']}" if cluster.get("message") else "")
            print(f"  {why}")
        from ..kube.jobs import describe_pod

        for v in cluster["pods"]:
            print(f"  {describe_pod(v)}")
    print(f"attempts {len(doc['attempts'])}, preemptions {doc['preemptions']}")
    _print_downtime(doc["downtime"])
    for a in doc["attempts"]:
        extra = ""
        if a.get("replayed") is not None:
            extra = f", restored in {a.get('restore_seconds', 0):.2f} s, replayed {a['replayed']}"
        place = f"pod {a['pod']}" if a.get("pod") else f"pid {a.get('pid')}"
        print(
            f"  #{a.get('attempt')} {a.get('outcome'):<10} {_when(a.get('started'))} → "
            f"{_when(a.get('ended'))}  from cell {a.get('resumed_from')} "
            f"on {a.get('node') or a.get('host')} {place}{extra}"
        )
        for line in _attempt_details(a):
            print(f"      {line}")
    return 0


def _clock(ts: float | None) -> str:
    if not ts:
        return "?"
    return datetime.datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-4]


def _print_downtime(report: dict[str, Any]) -> None:
    """The downtime report: what each preemption cost and the run's totals."""
    for e in report["preemptions"]:
        sp = e["split"]
        stop = _clock(e["stopped_at"]) if e["stopped_at"] else "unknown (no notice)"
        print(
            f"preemption attempt {e['attempt']} → {e['next_attempt']} ({e['how']} on "
            f"{e['node']}): last progress {_clock(e['last_progress_at'])}, stopped {stop}, "
            + (
                f"next pod on a node {_clock(e['next_scheduled_at'])}, "
                if e.get("next_scheduled_at")
                else ""
            )
            + f"next started {_clock(e['next_started_at'])}, new cells from "
            f"{_clock(e['running_new_cells_at'])}"
        )
        print(
            f"  gap {e['gap_seconds']:.2f} s = {sp['until_stopped']:.2f} s until stopped + "
            f"{sp['scheduling_and_node']:.2f} s scheduling/node + "
            f"{sp['image_and_kernel_start']:.2f} s image/kernel start + "
            f"{sp['state_restore']:.2f} s state restore; redone {e['redone_seconds']:.2f} s"
        )
    t = report["totals"]
    if t["preemptions"] or t["gpu_seconds"]:
        print(
            f"totals   {t['attempt_seconds']:.1f} s in attempts, {t['gpu_seconds']:.1f} "
            f"GPU-seconds, {t['wasted_seconds']:.1f} s wasted, {t['downtime_seconds']:.1f} s "
            f"down over {t['preemptions']} preemptions"
        )


_NOTICE_CELL = {
    "none": "no cell was running",
    "stopped": "the running cell saw spotbook.preempted() and stopped early",
    "finished": "the running cell finished within --grace",
    "interrupted": "the running cell outlived --grace and was interrupted; it runs again on resume",
}


def _attempt_details(a: dict[str, Any]) -> list[str]:
    """Image, accelerators, the termination notice and checkpoint traffic of one
    attempt, when known."""
    out = []
    if a.get("image"):
        out.append(f"image {a['image']}")
    gpus = a.get("gpus")
    if gpus:
        names = ", ".join(f"{g.get('name')} ({g.get('memory.total')} MiB)" for g in gpus)
        out.append(f"gpus {len(gpus)}: {names}")
    for name, info in sorted((a.get("frameworks") or {}).items()):
        seen = info.get("devices") or info.get("error") or "no GPU"
        out.append(f"{name} {info.get('version', '')} sees {seen}")
    notice = a.get("notice")
    if notice:
        what = _NOTICE_CELL.get(notice.get("cell"), notice.get("cell"))
        out.append(
            f"{notice.get('signal')}: {what}; ended {notice.get('seconds_to_stop', 0):.2f} s "
            "after the notice"
        )
    if a.get("snapshots_off"):
        out.append(f"snapshots off: {a['snapshots_off']}; a resume replays instead")
    if a.get("checkpoint_uploaded_bytes") or a.get("checkpoint_restored_bytes"):
        out.append(
            f"checkpoint files: {a.get('checkpoint_restored_bytes', 0)} bytes restored, "
            f"{a.get('checkpoint_uploaded_bytes', 0)} bytes saved"
        )
    if a.get("fidelity"):
        from ..attempt.fidelity import summary_lines

        out.extend(f"resume: {line}" for line in summary_lines(a["fidelity"]))
    return out


def _cmd_runs(args: argparse.Namespace) -> int:
    if args.cluster:
        return _cluster_runs(args)
    runs = local_runs()
    if not runs:
        print("no runs under ./.spotbook/runs (start one with `spotbook run NOTEBOOK`)")
        return 0
    print(f"{'RUN':<24} {'STATUS':<12} {'CELLS':>9} {'TRIES':>5}  SOURCE")
    for r in runs:
        cells = f"{r['cells_done']}/{r['cells_total']}"
        print(
            f"{r['run_id']:<24} {r['status']:<12} {cells:>9} {len(r['attempts']):>5}  {r['source']}"
        )
    return 0


def _cluster_runs(args: argparse.Namespace) -> int:
    from ..kube.jobs import job_view
    from ..kube.manifest import LABEL_RUN

    cluster = _cluster_for(args)
    jobs = cluster.list_jobs(all_namespaces=args.all_namespaces)
    if not jobs:
        where = "any namespace" if args.all_namespaces else f"namespace {cluster.namespace!r}"
        print(f"no spotbook Jobs in {where} (context {cluster.context_name})")
        return 0
    print(f"{'RUN':<24} {'NAMESPACE':<12} {'STATE':<10} {'FAILED PODS':>11}  RUN DIR")
    for job in sorted(jobs, key=lambda j: j["metadata"].get("creationTimestamp") or ""):
        meta = job["metadata"]
        view = job_view(job, [])
        st = job.get("status") or {}
        state = (
            view["state"]
            if view["state"] in ("succeeded", "failed", "queued")
            else ("active" if st.get("active") else "pending")
        )
        run_dir = (meta.get("annotations") or {}).get(ANNOTATION_RUN_DIR, "")
        print(
            f"{(meta.get('labels') or {}).get(LABEL_RUN, meta['name']):<24} "
            f"{meta.get('namespace', ''):<12} {state:<10} {st.get('failed', 0):>11}  {run_dir}"
        )
    return 0


def _say(line: str) -> None:
    print(f"spotbook: {line}", file=sys.stderr, flush=True)


def _cmd_drill(args: argparse.Namespace) -> int:
    store = _open_run(args)
    run = store.require_run()
    record = store.read_json(JOB_RECORD)
    attempts = store.attempts()
    last = max((int(a.get("attempt") or 0) for a in attempts), default=0)
    if record is not None:
        cluster = _cluster_for(args, record)
        _drill_cluster(cluster, run["spec"]["run_id"], args)
        return _report_recovery(store, last, args.timeout, None, _cluster_view(args, cluster))
    took = _drill_local(store, run, attempts, args)
    if args.no_resume:
        return 0
    _say("resuming, as the Job controller would")
    _run_runner(store, args)
    return _report_recovery(store, last, 0.0, took)


def _drill_local(
    store: RunStore, run: dict[str, Any], attempts: list[dict[str, Any]], args: argparse.Namespace
) -> float:
    import signal
    import socket

    from .._models import SAVE_BUDGET
    from .._status import alive

    current = attempts[-1] if attempts else {}
    pid = int(current.get("pid") or 0)
    if (
        current.get("outcome") != "running"
        or current.get("host") != socket.gethostname()
        or not pid
        or not alive(pid)
    ):
        raise UsageError(
            f"run {run['spec']['run_id']} is not running on this machine (status "
            f"{run.get('status')}); start it with `spotbook run` or `spotbook resume`, then drill"
        )
    from ..attempt.environment import process_started

    recorded, now = current.get("process_started"), process_started(pid)
    if recorded is not None and now is not None and abs(float(recorded) - now) > 2.0:
        # the runner died and its pid was reused: never signal a stranger
        raise UsageError(
            f"run {run['spec']['run_id']} is not running: its runner (pid {pid}) is gone and "
            "that pid now belongs to another process; resume the run with `spotbook resume`"
        )
    grace = float((run["spec"].get("limits") or {}).get("grace", Limits().grace))
    n = int(current["attempt"])
    t0 = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    _say(f"sent SIGTERM to the runner (pid {pid}, attempt {n})")
    budget = grace + SAVE_BUDGET + 5.0

    def running() -> bool:
        rec = store.read_json(f"attempts/{n:04d}.json") or {}
        return alive(pid) and rec.get("outcome") == "running"

    while running() and time.monotonic() - t0 < budget:
        time.sleep(0.05)
    took = time.monotonic() - t0
    if running():
        os.kill(pid, signal.SIGKILL)
        _say(f"the runner did not stop within {budget:.0f} s: sent SIGKILL")
    else:
        _say(f"the runner stopped {took:.2f} s after the notice")
    return took


def _drill_cluster(cluster: Any, run_id: str, args: argparse.Namespace) -> None:
    import subprocess

    from ..kube.jobs import pod_view

    views = [pod_view(p) for p in cluster.pods(run_id)]
    live = [v for v in views if v["state"] == "running"]
    if not live:
        states = ", ".join(f"{v['name']} {v['state']}" for v in views) or "no pods"
        raise UsageError(f"run {run_id} has no running pod to disrupt ({states})")
    pod = live[-1]
    if args.how == "evict":
        cluster.evict(pod["name"])
        _say(f"evicted pod {pod['name']} on {pod['node']} through the Eviction API")
        return
    # GKE nodes are Compute Engine instances: spec.providerID is gce://PROJECT/ZONE/NAME
    where = cluster.provider_id(pod["node"])
    if not where.startswith("gce://"):
        kind = where.split(":", 1)[0] or "unknown"
        raise UsageError(
            f"--how maintenance simulates a Compute Engine maintenance event, which exists on "
            f"GKE only; node {pod['node']} is an {kind!r} node: use --how evict"
        )
    parts = where[len("gce://") :].split("/")
    if len(parts) != 3 or not all(parts):
        raise UsageError(f"node {pod['node']}: unexpected providerID {where!r}")
    project, zone, instance = parts
    cmd = [
        "gcloud",
        "compute",
        "instances",
        "simulate-maintenance-event",
        instance,
        f"--zone={zone}",
        f"--project={project}",
    ]
    print(shlex.join(cmd))
    if not args.yes:
        raise _DrillNotRun("printed the command above; run it (or pass --yes) to cause the event")
    if subprocess.run(cmd, check=False).returncode != 0:
        raise _PlanStepError(f"`{shlex.join(cmd)}` failed; see its message above")


class _DrillNotRun(SpotbookError):
    """Nothing was disrupted: the command to do it was printed (exit 0)."""


def _recovered(doc: dict[str, Any], before: int) -> list[dict[str, Any]]:
    """Preemptions since attempt ``before`` whose next attempt runs new cells (or has
    ended): until then its figures are not final."""
    attempts = {a.get("attempt"): a for a in doc["attempts"]}
    out = []
    for e in doc["downtime"]["preemptions"]:
        b = attempts.get(e["next_attempt"]) or {}
        if e["attempt"] >= before and (
            b.get("resumed_at") is not None or b.get("outcome") != "running"
        ):
            out.append(e)
    return out


def _report_recovery(
    store: RunStore,
    before: int,
    timeout: float,
    stopped_in: float | None,
    cluster: ClusterView | None = None,
) -> int:
    """Wait until an attempt after ``before`` runs new cells (or the run ends); report."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        doc = describe(store, cluster=cluster)
        events = _recovered(doc, before)
        done = doc["status"] in ("succeeded", "failed", "cancelled")
        if events or done or time.monotonic() > deadline:
            break
        if not told:
            _say("following the run until it runs new cells again")
            told = True
        time.sleep(1.0)
    if not events:
        if done:
            _say(f"the run {doc['status']} without another attempt; nothing to report")
            return 0
        raise _PlanStepError(
            f"no new attempt of the run within {timeout:.0f} s; see `spotbook status {store.url}`"
        )
    event = events[0]
    if stopped_in is not None:
        event["sigterm_to_exit_seconds"] = round(stopped_in, 3)
    _print_downtime({"preemptions": [event], "totals": {"preemptions": 0, "gpu_seconds": 0}})
    print(json.dumps({"drill": event}, indent=2))
    return 0


def _cmd_cluster_plan(args: argparse.Namespace) -> int:
    from ..kube import plans as plans
    from ..kube.manifest import parse_gpu

    gpu, count = parse_gpu(args.gpu)
    zones = getattr(args, "node_locations", None) or ""
    opts = plans.PlanOptions(
        cluster=args.cluster,
        location=args.location or "",
        project=getattr(args, "project", None) or "",
        gpu=gpu or "",
        gpu_count=count or 1,
        node_locations=tuple(z.strip() for z in zones.split(",") if z.strip()),
        registry=args.registry or "",
        machine_type=args.machine_type,
        system_machine_type=args.system_machine_type,
        max_nodes=args.max_nodes,
        bucket=args.bucket or "",
        namespace=args.namespace,
        service_account=args.service_account,
    )
    provider = args.command
    if args.verb == "down":
        steps = plans.gke_down(opts, delete_bucket=args.delete_bucket)
    else:
        steps = {"gke": plans.gke_plan, "eks": plans.eks_plan, "aks": plans.aks_plan}[provider](
            opts
        )
    hint = None if args.verb == "down" else plans.submit_hint(opts, provider)
    image = [] if args.verb == "down" else plans.image_hint(opts, provider)
    if args.output_format == "json":
        print(plans.to_json(steps))
    else:
        print(plans.render(steps, hint, checks=provider == "gke", image=image), end="")
    if args.verb == "plan":
        return 0
    return _run_plan(steps, args)


def _run_plan(steps: list[Any], args: argparse.Namespace) -> int:
    import subprocess

    from ..kube import plans as plans

    todo = list(enumerate(steps, 1))[args.start - 1 :]
    if not todo:
        raise UsageError(f"--from {args.start}: the plan has {len(steps)} steps")
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("not a terminal to confirm on: review the plan, then pass --yes")
        answer = input(f"Run steps {todo[0][0]}-{todo[-1][0]} above? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("spotbook: nothing was run", file=sys.stderr)
            return 0
    for n, step in todo:
        print(f"spotbook: step {n}/{len(steps)}: {step.what}", file=sys.stderr, flush=True)
        if step.done_if and _succeeds(step.done_if):
            print(
                f"spotbook: step {n}: already done (`{shlex.join(step.done_if)}` found it); "
                "skipped",
                file=sys.stderr,
                flush=True,
            )
            continue
        # a "$(...)" argument is a lookup the shell does, as in the printed plan
        lookup = any("$(" in a for a in step.argv)
        argv = ["bash", "-c", plans.shell_join(step.argv)] if lookup else list(step.argv)
        try:
            proc = subprocess.run(argv, input=step.stdin, text=True, check=False)
            code = proc.returncode
        except FileNotFoundError:
            code = 127
        if code != 0:
            raise _PlanStepError(
                f"step {n} failed (exit {code}): {shlex.join(step.argv)}; fix the cause and "
                f"continue with `spotbook {args.command} {args.verb} ... --from {n}`"
                + (f" (steps 1-{n - 1} are done)" if n > 1 else "")
            )
    print(f"spotbook: all {len(steps)} steps done", file=sys.stderr)
    return 0


def _succeeds(argv: Sequence[str]) -> bool:
    """Whether a read-only check command exits 0 (its output is not shown)."""
    import subprocess

    try:
        done = subprocess.run(list(argv), capture_output=True, check=False, timeout=120)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


class _PlanStepError(StorageError):
    """A cloud command of the plan failed (exit 3: fix and continue)."""


COMMANDS = {
    "run": _cmd_run,
    "inspect": _cmd_inspect,
    "resume": _cmd_resume,
    "status": _cmd_status,
    "runs": _cmd_runs,
    "worker": _cmd_worker,
    "submit": _cmd_submit,
    "logs": _cmd_logs,
    "cancel": _cmd_cancel,
    "recover": _cmd_recover,
    "drill": _cmd_drill,
    "gke": _cmd_cluster_plan,
    "eks": _cmd_cluster_plan,
    "aks": _cmd_cluster_plan,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "WARNING")
    logging.basicConfig(format="spotbook: %(message)s", stream=sys.stderr)
    logging.getLogger("spotbook").setLevel(level)
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        # against a GCS emulator there are no Google credentials to find; say nothing
        logging.getLogger("google.auth").setLevel(logging.ERROR)
    try:
        return COMMANDS[args.command](args)
    except _DrillNotRun as exc:
        print(f"spotbook: {exc}", file=sys.stderr)
        return 0
    except SpotbookError as exc:
        code = exit_code(exc)
        prefix = "" if isinstance(exc, Terminated) else "error: "
        print(f"spotbook: {prefix}{exc}", file=sys.stderr)
        return code
    except KeyboardInterrupt:
        print("spotbook: interrupted", file=sys.stderr)
        return 75
    except Exception:
        # Not a user error: show where, and use the "may pass on retry" code rather
        # than 1, which tells a Job controller the notebook itself is broken.
        traceback.print_exc()
        print(
            "spotbook: internal error: this is a bug in spotbook; please report it with "
            "the traceback above",
            file=sys.stderr,
        )
        return 3


if __name__ == "__main__":
    sys.exit(main())
