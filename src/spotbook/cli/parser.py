"""The argument parser: papermill's flags with papermill's meaning, and spotbook's own."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from .._models import (
    Limits,
    SnapshotPolicy,
    __version__,
    parse_rate,
    parse_size,
)

log = logging.getLogger("spotbook")


def _add_run_flags(p: argparse.ArgumentParser, pipes: bool = False) -> None:
    """papermill's flags, same names and meaning, plus spotbook's own. ``pipes``: INPUT
    may be left out when a pipe is on stdin, as papermill allows (``run``)."""
    _add_parameter_flags(
        p,
        "where to write the result; - for stdout (left out with stdout a pipe or file and "
        "no --run-dir: stdout, as papermill does)"
        if pipes
        else "where to write the result; - for stdout",
        pipes,
    )
    _add_execution_flags(p)


def _add_allow_errors(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--allow-errors",
        action="store_true",
        help="as nbconvert's: a failing cell's error stays in the notebook and the run goes "
        "on to the end (exit 0); a cell tagged raises-exception is always allowed to fail",
    )


def _add_parameter_flags(p: argparse.ArgumentParser, output_help: str, pipes: bool = False) -> None:
    if pipes:
        p.add_argument(
            "input",
            metavar="INPUT",
            nargs="?",
            help="notebook path or fsspec URL; - for stdin (left out with a pipe on stdin: "
            "stdin, and a single path given is OUTPUT, as papermill does)",
        )
    else:
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
        "--snapshot-background",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="write snapshots while the notebook goes on (default): from a fork of the "
        "kernel, or staged (changed buffers copied, written by a thread) where forking is "
        "unsafe: torch, polars, LightGBM, a GPU context, the notebook's own threads",
    )
    s.add_argument(
        "--snapshot-hazard",
        default="1/h",
        metavar="RATE",
        help="with auto: preemptions expected per node-hour (1/h, 12/d); snapshots that cost "
        "much come at least as often as this rate makes them worth (default 1/h)",
    )
    s.add_argument(
        "--files-budget",
        default="20G",
        metavar="SIZE",
        help="save at most SIZE of the files the run writes with its snapshots (default 20G); "
        "what is over it is named when a resume on a new node lacks it",
    )
    s.add_argument(
        "--files-exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="do not save files matching GLOB (on the path, its name, or its path under the "
        "working directory) with the snapshots; repeatable",
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


def _add_submit_flags(p: argparse.ArgumentParser, image_required: bool = True) -> None:
    from ..kube.manifest import DEFAULT_BACKOFF, PROVIDERS

    _add_cluster_flags(p)
    k = p.add_argument_group("the Job")
    k.add_argument(
        "--image", required=image_required, help="container image with spotbook installed"
    )
    k.add_argument("--gpu", metavar="TYPE[:COUNT]", help="e.g. nvidia-l4, nvidia-l4:2, or 1")
    k.add_argument("--cpu", metavar="CPU", help="CPU request, e.g. 4 or 500m")
    k.add_argument("--memory", metavar="MEM", help="memory request and limit, e.g. 16Gi")
    k.add_argument(
        "--work-storage",
        default="20Gi",
        metavar="SIZE",
        help="the notebook's working directory in the pod (an emptyDir at /spotbook/work, "
        "with HOME and TMPDIR in it): its size limit and ephemeral-storage request "
        "(default 20Gi)",
    )
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
    k.add_argument(
        "--fallback-after-preemptions",
        type=int,
        metavar="N",
        help="after N preemptions, run the next attempt on on-demand nodes (applied by "
        "--wait or `spotbook wait RUN`)",
    )
    k.add_argument(
        "--fallback-after-pending",
        metavar="DURATION",
        help="when a pod waits this long for a spot node (e.g. 15m), fall back to on-demand",
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


SWEEP_VERBS = ("resume", "status", "results")
RUNS_VERBS = ("rm", "gc")


def _add_sweep_parsers(sub: Any) -> None:
    sw = sub.add_parser(
        "sweep",
        help="run a notebook over a grid of parameters: -p NAME V1,V2,... (also: sweep "
        "resume|status|results URL)",
        description="Each point of the grid is a run of its own in --run-dir/points/<i>. "
        "A list is swept: -p lr 0.1,0.01 (typed as -p types values), lists in -y/-f YAML "
        "(lists under a 'zip:' key go together), rows of --rows FILE.csv|.jsonl; axes "
        "combine as a product. OUTPUT may be a template: out_{lr}.ipynb. Locally "
        "--parallel points run at once; --submit runs them as one Indexed Job. Then: "
        "`spotbook sweep status URL`, `sweep resume URL`, `sweep results URL -o FILE`.",
    )
    _add_run_flags(sw)
    _add_submit_flags(sw, image_required=False)
    g = sw.add_argument_group("the sweep")
    g.add_argument("--rows", metavar="FILE", help="points as rows of a .csv or .jsonl file")
    g.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="points at once (default: locally one per core and GiB of free memory; "
        "submitted, every point)",
    )
    g.add_argument(
        "--submit", action="store_true", help="run the points as one Indexed Job (submit's flags)"
    )
    g.add_argument(
        "--max-failed-points",
        type=int,
        metavar="N",
        help="submitted: stop the Job after N points failed (default: every point runs)",
    )
    g.add_argument("--json", action="store_true", help="print the final table as JSON")
    resume = sub.add_parser("sweep-resume", prog="spotbook sweep resume")
    resume.add_argument("url", metavar="URL", help="the sweep's --run-dir")
    resume.add_argument("--parallel", type=int, metavar="N")
    resume.add_argument("--json", action="store_true")
    _add_common(resume)
    status = sub.add_parser("sweep-status", prog="spotbook sweep status")
    status.add_argument("url", metavar="URL", help="the sweep's --run-dir")
    how = status.add_mutually_exclusive_group()
    how.add_argument("--json", action="store_true")
    how.add_argument("--csv", action="store_true")
    results = sub.add_parser("sweep-results", prog="spotbook sweep results")
    results.add_argument("url", metavar="URL", help="the sweep's --run-dir")
    results.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the table: .csv, .jsonl, or .parquet (with pandas); default CSV on stdout",
    )


def _add_view_parsers(sub: Any) -> None:
    rp = sub.add_parser(
        "report",
        help="a run as one HTML file: summary, time line of attempts, the rendered notebook",
        description="Write the run's report: status, parameters, attempts, preemptions, the "
        "downtime split and cost when known, a time line of attempts and downtime (inline "
        "SVG), and the notebook rendered by nbconvert. The file loads nothing from anywhere.",
    )
    rp.add_argument("run", metavar="RUN", help="run id or run store URL")
    rp.add_argument("-o", "--output", metavar="FILE", required=True, help="HTML file, or - ")
    rp.add_argument("--prices", metavar="FILE", help="a price table for the cost (see cost)")
    _add_cluster_flags(rp)
    ui = sub.add_parser(
        "ui",
        help="a local web dashboard of runs and sweeps (local, object stores, cluster)",
        description="Serve a dashboard of runs and sweeps: the list, each run's live "
        "progress, time line, fidelity report, output and rendered notebook, refreshed "
        "while runs progress. Listens on 127.0.0.1 unless --host and --allow-remote say "
        "otherwise; then every request needs the token printed with the URL.",
    )
    ui.add_argument(
        "--store",
        action="append",
        metavar="URL",
        help="a folder or bucket URL holding run stores and sweeps (repeatable)",
    )
    ui.add_argument(
        "--no-local",
        action="store_true",
        help="leave out ./.spotbook/runs and the library's runs folder",
    )
    ui.add_argument("--cluster", action="store_true", help="also list the cluster's spotbook Jobs")
    ui.add_argument("-A", "--all-namespaces", action="store_true")
    ui.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=8765, help="0 picks a free port (default 8765)")
    ui.add_argument(
        "--allow-remote",
        action="store_true",
        help="allow a --host other machines can reach (a token is then required)",
    )
    ui.add_argument(
        "--token",
        help="the token requests must carry, at least 22 characters (default: "
        "$SPOTBOOK_UI_TOKEN, or made)",
    )
    ui.add_argument(
        "--refresh", type=float, default=2.0, metavar="SECONDS", help="live refresh (default 2)"
    )
    _add_cluster_flags(ui)


def _add_economics_parsers(sub: Any) -> None:
    co = sub.add_parser(
        "cost",
        help="what a run or sweep cost: node- and GPU-hours, preemption overhead, money",
        description="Per attempt: node-hours, GPU-hours, compute lost and redone to "
        "preemptions, time waiting for a node, and money at the attempt's capacity (spot or "
        "on demand) and at both, from spotbook's dated price table (--prices FILE for "
        "yours). What cannot be priced is named, never guessed.",
    )
    co.add_argument("run", metavar="RUN", help="run id, run store URL, or a sweep's URL")
    co.add_argument("--json", action="store_true")
    co.add_argument(
        "--prices", metavar="FILE", help="a price table (spotbook/data/prices.json's layout)"
    )
    co.add_argument(
        "--provider", choices=["gke", "eks", "aks"], help="for attempts that did not record it"
    )
    co.add_argument("--region", metavar="REGION", help="for attempts that did not record it")
    co.add_argument("--machine-type", metavar="TYPE", help="for attempts that did not record it")
    co.add_argument(
        "--capacity", choices=["spot", "on-demand"], help="for attempts that did not record it"
    )
    _add_cluster_flags(co)
    si = sub.add_parser(
        "simulate",
        help="a long run under preemption, from a real run's profile: cost and finish per strategy",
        description="Take a finished run's cell durations, snapshot cost, kernel start and "
        "restore, tile them to --duration, and simulate preemptions at --hazard (per "
        "node-hour) or at the times in --trace: expected cost ratio (billed node time over "
        "an uninterrupted run's) and finish time for spotbook's resume (its auto policy, and "
        "the Young/Daly snapshot interval, checked against the simulation) and for "
        "restarting from scratch.",
    )
    si.add_argument("--from", dest="run", required=True, metavar="RUN", help="a finished run")
    si.add_argument("--duration", metavar="DURATION", help="tile the profile to this long, e.g. 3h")
    si.add_argument(
        "--hazard", default="1/h", metavar="RATE", help="preemptions per node-hour (1, 1/h, 12/d)"
    )
    si.add_argument("--trace", metavar="FILE", help="preemption times in node seconds, instead")
    si.add_argument(
        "--delay", type=float, default=60.0, metavar="S", help="to a new node (default 60)"
    )
    si.add_argument(
        "--interval", type=float, metavar="S", help="also simulate this snapshot interval"
    )
    si.add_argument("--trials", type=int, default=2000)
    si.add_argument("--seed", type=int, default=0)
    si.add_argument("--json", action="store_true")
    ch = sub.add_parser(
        "chaos",
        help="run a notebook here while preempting it on purpose; resume vs restart, measured",
        description="Run the notebook uninterrupted, then with preemptions injected at "
        "--hazard or at the --trace times (node time), SIGKILL (no notice) or SIGTERM (a "
        "notice), waiting --delay for a new node after each: once resuming (spotbook), once "
        "restarting from scratch. Prints billed time, finish time and cost ratio per "
        "strategy beside the simulator's prediction for the same profile and times.",
    )
    ch.add_argument("input", metavar="NOTEBOOK")
    ch.add_argument("--work", default=".spotbook/chaos", metavar="DIR", help="run stores go here")
    ch.add_argument("--hazard", metavar="RATE", help="preemptions per node-hour (1, 60/h, 2/m)")
    ch.add_argument("--trace", metavar="FILE", help="preemption times in node seconds")
    ch.add_argument(
        "--delay", type=float, default=5.0, metavar="S", help="to a new node (default 5)"
    )
    ch.add_argument("--signal", choices=["SIGKILL", "SIGTERM"], default="SIGKILL")
    ch.add_argument("--strategy", action="append", choices=["resume", "restart"])
    ch.add_argument("--seed", type=int, default=0)
    ch.add_argument("--json", action="store_true")
    ch.add_argument(
        "-p", "--parameters", nargs=2, action="append", default=[], metavar=("NAME", "VALUE")
    )
    ch.add_argument(
        "-r", "--parameters_raw", nargs=2, action="append", default=[], metavar=("NAME", "VALUE")
    )
    ch.add_argument("-y", "--parameters_yaml", action="append", default=[], metavar="YAML")
    ch.add_argument("-f", "--parameters_file", action="append", default=[], metavar="FILE")
    _add_common(ch)


def build_parser() -> argparse.ArgumentParser:
    """The ``spotbook`` argument parser, every command and flag."""
    parser = argparse.ArgumentParser(
        prog="spotbook",
        description="Run notebooks as batch jobs that survive preemption.",
    )
    parser.add_argument("--version", action="version", version=f"spotbook {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser("run", help="run a notebook (papermill's flags), saving progress")
    _add_run_flags(run, pipes=True)
    _add_allow_errors(run)
    run.add_argument(
        "--name",
        metavar="NAME",
        help="name the run: its store is .spotbook/runs/NAME, every command takes NAME "
        "(from any folder), and the same --name again continues it",
    )
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
    _add_allow_errors(sb)
    _add_submit_flags(sb)
    st = sub.choices["status"]
    _add_cluster_flags(st)
    wt = sub.add_parser(
        "wait",
        help="follow a submitted run until it ends (applying its fallback policy); exit "
        "with the run's code",
    )
    wt.add_argument("run", metavar="RUN", help="run id or run store URL")
    _add_cluster_flags(wt)
    lg = sub.add_parser(
        "logs",
        help="a run's output: its cells' outputs as they are saved (a run on this machine), "
        "or its pod's log (a submitted run, as kubectl logs)",
    )
    lg.add_argument("run", metavar="RUN", help="run id or run store URL")
    lg.add_argument("-f", "--follow", action="store_true", help="keep streaming")
    lg.add_argument("--all", action="store_true", help="every attempt's pod, oldest first")
    _add_cluster_flags(lg)
    cn = sub.add_parser(
        "cancel",
        help="stop a run, progress kept: on this machine as Ctrl-C would (resumable); a "
        "submitted run by deleting its Job",
    )
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
    _add_sweep_parsers(sub)
    _add_economics_parsers(sub)
    _add_view_parsers(sub)
    runs = sub.add_parser(
        "runs",
        help="list runs: every run this user started on this machine (wherever its store "
        "is) and this folder's, or the cluster's Jobs with --cluster (also: runs rm RUN..., "
        "runs gc --keep N --older-than D)",
    )
    runs.add_argument("--json", action="store_true", help="each run's `status --json`")
    runs.add_argument(
        "--status",
        metavar="STATUS",
        help="only runs with this status (running, interrupted, succeeded, failed, ...)",
    )
    runs.add_argument(
        "--since", metavar="DURATION", help="only runs started in the last DURATION (6h, 2d)"
    )
    runs.add_argument("--cluster", action="store_true", help="list the Jobs spotbook made")
    rm = sub.add_parser(
        "runs-rm",
        prog="spotbook runs rm",
        description="Delete runs' stores and their entries in the index of runs (never a "
        "running one, nor a submitted one its Job may still start).",
    )
    rm.add_argument("runs", nargs="+", metavar="RUN", help="run id or run store URL")
    gc = sub.add_parser(
        "runs-gc",
        prog="spotbook runs gc",
        description="Delete the runs `spotbook runs` lists beyond a retention rule: all but "
        "the newest --keep N, only those started --older-than DURATION ago; never a running "
        "one.",
    )
    gc.add_argument("--keep", type=int, metavar="N", help="keep the newest N runs")
    gc.add_argument(
        "--older-than",
        metavar="DURATION",
        help="delete only runs started at least this long ago (30d, 12h)",
    )
    gc.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")
    runs.add_argument("-A", "--all-namespaces", action="store_true")
    _add_cluster_flags(runs)
    tr = sub.add_parser(
        "trust",
        help="resume a run store made by an older spotbook (nothing in it sealed) on this machine",
        description="Trust one run store from before the seal: `resume` then resumes it on "
        "this machine, for this user (never in a pod). Only for a store whose every writer "
        "you trust: nothing in it is sealed with a key kept outside it.",
    )
    tr.add_argument("run", metavar="RUN", help="run id or run store URL")
    tr.add_argument("--remove", action="store_true", help="take the trust back")
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


def snapshot_policy(args: argparse.Namespace) -> SnapshotPolicy:
    """The snapshot flags of run, submit and sweep as one policy."""
    return SnapshotPolicy.parse(
        args.snapshot,
        args.snapshot_interval,
        background=getattr(args, "snapshot_background", True),
        hazard=parse_rate(getattr(args, "snapshot_hazard", "1/h"), "--snapshot-hazard"),
        files_budget=parse_size(getattr(args, "files_budget", "20G"), "--files-budget"),
        files_exclude=tuple(getattr(args, "files_exclude", None) or ()),
    )
