"""Spot economics: the price table, what a run cost (with a preemption and an on-demand
attempt), the simulator against its own arithmetic and Young/Daly, a real notebook
preempted on purpose against the simulator, and the capacity fallback on the fake API."""

from __future__ import annotations

import json
import random
import signal
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from spotbook._errors import UsageError
from spotbook.attempt.environment import machine
from spotbook.economics.prices import load_prices
from spotbook.economics.simulate import (
    Outcome,
    Profile,
    best_interval,
    run_once,
    simulate,
    simulate_run,
    young_daly,
)
from spotbook.store.runstore import RunStore

from .conftest import cells_committed, cli, kill, start_cli, wait_for, write_notebook
from .servers import FakeKube
from .test_cluster import disrupted, pod, submit_args, terminated, worker


# -- prices ---------------------------------------------------------------------------
def test_prices_are_looked_up_never_guessed(tmp_path: Path) -> None:
    table = load_prices()
    assert table.date.startswith("2026-") and table.currency == "USD"
    p = table.find("gke", "us-central1-a", "g2-standard-8")  # a zone finds its region
    assert p is not None and p.gpu == "nvidia-l4" and p.spot < p.on_demand
    assert p.per_hour("spot") == p.spot and p.per_hour("on-demand") == p.on_demand
    assert table.find("gke", "us-central1", "g2-standard-999") is None
    assert table.find("gke", "mars-north1", "g2-standard-8") is None
    assert table.find(None, "us-central1", "g2-standard-8") is None
    mine = tmp_path / "prices.json"
    mine.write_text(json.dumps({"date": "2027-01-01", "prices": [
        {"provider": "gke", "region": "us-central1", "machine_type": "g2-standard-8",
         "on_demand": 1.0, "spot": 0.1}]}))  # fmt: skip
    own = load_prices(str(mine))
    assert own.source == str(mine) and own.find("gke", "us-central1", "g2-standard-8").spot == 0.1
    mine.write_text(json.dumps({"prices": [{"provider": "gke"}]}))
    with pytest.raises(UsageError, match="price 0 needs provider, region, machine_type"):
        load_prices(str(mine))
    with pytest.raises(UsageError, match="no such file"):
        load_prices(str(tmp_path / "none.json"))


# -- where an attempt ran: the cloud's metadata server, faked on loopback ---------------
class _Metadata(BaseHTTPRequestHandler):
    answers: ClassVar[dict[str, str]] = {
        "/computeMetadata/v1/instance/machine-type": "projects/1/machineTypes/g2-standard-8",
        "/computeMetadata/v1/instance/zone": "projects/1/zones/us-central1-b",
        "/computeMetadata/v1/instance/scheduling/provisioning-model": "SPOT",
        "/latest/api/token": "tok",
        "/latest/meta-data/instance-type": "g6.xlarge",
        "/latest/meta-data/placement/availability-zone": "us-east-1a",
        "/latest/meta-data/placement/region": "us-east-1",
        "/latest/meta-data/instance-life-cycle": "on-demand",
        "/metadata/instance/compute": json.dumps(
            {"vmSize": "Standard_NC4as_T4_v3", "location": "eastus", "priority": "Spot"}
        ),
    }
    seen: ClassVar[list[tuple[str, str, dict[str, str]]]] = []

    def _answer(self) -> None:
        path = self.path.split("?", 1)[0]
        self.seen.append((self.command, path, dict(self.headers)))
        body = self.answers.get(path)
        ok = body is not None and (
            self.headers.get("Metadata-Flavor") == "Google"
            or self.headers.get("Metadata") == "true"
            or path == "/latest/api/token"
            or self.headers.get("X-aws-ec2-metadata-token") == "tok"
        )
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write((body or "").encode())

    do_GET = do_PUT = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def metadata() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_each_attempt_asks_its_clouds_metadata_server(metadata: str) -> None:
    assert machine({}) == {}  # a local run: nothing is asked, nothing known
    gke = machine({"SPOTBOOK_PROVIDER": "gke", "SPOTBOOK_METADATA_URL": metadata})
    assert gke == {"provider": "gke", "machine_type": "g2-standard-8", "zone": "us-central1-b",
                   "region": "us-central1", "capacity": "spot"}  # fmt: skip
    eks = machine({"SPOTBOOK_PROVIDER": "eks", "SPOTBOOK_METADATA_URL": metadata})
    assert (eks["machine_type"], eks["region"], eks["capacity"]) == (
        "g6.xlarge", "us-east-1", "on-demand")  # fmt: skip
    assert ("PUT", "/latest/api/token") in [(m, p) for m, p, _ in _Metadata.seen]  # IMDSv2
    aks = machine({"SPOTBOOK_PROVIDER": "aks", "SPOTBOOK_METADATA_URL": metadata,
                   "SPOTBOOK_CAPACITY": "on-demand"})  # fmt: skip
    assert aks["machine_type"] == "Standard_NC4as_T4_v3" and aks["region"] == "eastus"
    assert aks["capacity"] == "on-demand"  # the Job's word wins over the metadata's
    down = machine({"SPOTBOOK_PROVIDER": "gke", "SPOTBOOK_METADATA_URL": "http://127.0.0.1:9"})
    assert down["provider"] == "gke" and "metadata_error" in down


# -- what a run cost ------------------------------------------------------------------
@pytest.mark.slow
def test_cost_of_a_run_preempted_once_and_resumed_on_demand(work: Path, metadata: str) -> None:
    env = {"SPOTBOOK_PROVIDER": "gke", "SPOTBOOK_METADATA_URL": metadata}
    runner = start_cli("run", "sleepy.ipynb", "--run-dir", "rd", cwd=work, env=env)
    wait_for(lambda: cells_committed(work / "rd") >= 3, what="3 cells")
    kill(runner, signal.SIGKILL)
    # the next attempt is the fallback's: the same machine type, on demand
    r = cli("resume", "rd", cwd=work, env={**env, "SPOTBOOK_CAPACITY": "on-demand"})
    assert r.returncode == 0, r.stderr
    out = cli("cost", "rd", "--json", cwd=work)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    price = load_prices().find("gke", "us-central1", "g2-standard-8")
    assert price is not None
    first, second = doc["attempts"]
    assert first["machine"]["capacity"] == "spot" and second["machine"]["capacity"] == "on-demand"
    assert first["cost"] == round(first["node_seconds"] / 3600 * price.spot, 4)
    assert second["cost"] == round(second["node_seconds"] / 3600 * price.on_demand, 4)
    assert first["outcome"] == "killed" and first["lost_seconds"] >= 0
    assert second["restart_seconds"] > 0  # kernel start and restore after the preemption
    t = doc["totals"]
    assert t["cost"] == pytest.approx(first["cost"] + second["cost"], abs=2e-4)
    assert t["cost_all_spot"] < t["cost"] < t["cost_all_on_demand"]
    assert t["preemptions"] == 1 and 0 < t["preemptions_added"] < t["cost"]
    assert t["node_hours"] == pytest.approx(
        (first["node_seconds"] + second["node_seconds"]) / 3600, abs=1e-5
    )
    assert doc["unknown"] == [] and doc["prices"]["date"] == load_prices().date
    text = cli("cost", "rd", cwd=work).stdout
    assert "gke g2-standard-8 us-central1 (on-demand)" in text and "preemptions added" in text
    shown = cli("status", "rd", cwd=work).stdout
    assert "machine gke g2-standard-8 us-central1-b (on-demand)" in shown
    # a run that recorded no machine is not priced, and says what to give
    local = cli("run", "sleepy.ipynb", "--run-dir", "plain", cwd=work)
    assert local.returncode == 0, local.stderr
    bare = json.loads(cli("cost", "plain", "--json", cwd=work).stdout)
    assert bare["totals"]["cost"] is None and bare["totals"]["node_hours"] > 0
    assert "no provider, region, machine_type recorded (give --provider)" in bare["unknown"][0]
    given = cli("cost", "plain", "--json", "--provider", "eks", "--region", "us-east-1",
                "--machine-type", "g6.xlarge", cwd=work)  # fmt: skip
    priced = json.loads(given.stdout)["totals"]
    assert priced["cost"] == priced["cost_all_spot"] and priced["cost"] > 0
    unknown = cli("cost", "plain", "--json", "--provider", "eks", "--region", "us-east-1",
                  "--machine-type", "x9.huge", cwd=work)  # fmt: skip
    assert "not in the price table" in json.loads(unknown.stdout)["unknown"][0]


# -- the simulator --------------------------------------------------------------------
def test_one_simulated_run_adds_up() -> None:
    profile = Profile((1.0,) * 10, 0.1, 1.0, 0.2, kernel_seconds=0.6, finish_seconds=0.3)
    # start 1.0; cells 0,1 then a snapshot (3.1); cell 2 (4.1); the kill at 4.5 takes
    # 1.4 s of compute; resume: start + restore (5.7), cells 2..9 with three snapshots
    # (14.0), the finish (14.3)
    out = run_once(profile, "resume", interval=2.0, delay=5.0, times=[4.5])
    assert (out.preemptions, round(out.lost, 6)) == (1, 1.4)
    assert round(out.billed, 6) == 14.3 and round(out.finish, 6) == 19.3
    # restarting loses all 3.5 s and pays the start again: 4.5 + 1 + 10 + 0.3
    again = run_once(profile, "restart", interval=None, delay=5.0, times=[4.5])
    assert round(again.billed, 6) == 15.8 and round(again.lost, 6) == 3.5
    # killed while saving the output: a resume has every cell and starts no kernel
    tail = run_once(profile, "resume", interval=None, delay=1.0, times=[11.1])
    assert round(tail.billed, 6) == round(11.1 + 0.4 + 0.3, 6) and tail.lost == 0
    none = run_once(profile, "resume", interval=2.0, delay=5.0, times=[])
    assert none.preemptions == 0 and none.finish == none.billed


def test_the_simulator_agrees_with_one_that_steps_cell_by_cell() -> None:
    """800 random profiles (tiled or not, synchronous or background snapshots, a first
    interval or not), preemption times and strategies: the simulator that goes from
    preemption to preemption bills, loses and counts what stepping every cell does."""
    rng = random.Random(20261202)
    for case in range(800):
        start = rng.uniform(0.0, 2.0)
        cells = tuple(rng.choice([0.0, rng.uniform(0.0, 3.0)]) for _ in range(rng.randint(1, 12)))
        profile = Profile(
            cells,
            snapshot_seconds=rng.choice([0.0, rng.uniform(0.0, 1.0)]),
            start_seconds=start,
            restore_seconds=rng.uniform(0.0, 1.0),
            kernel_seconds=rng.uniform(0.0, start),
            finish_seconds=rng.uniform(0.0, 1.0),
            write_seconds=rng.choice([0.0, rng.uniform(0.0, 4.0)]),
        )
        if rng.random() < 0.4:
            profile = profile.tiled(profile.compute * rng.uniform(1.0, 5.0))
        strategy = rng.choice(["resume", "resume", "restart"])
        interval = rng.choice([None, rng.uniform(0.3, 6.0)])
        first = rng.choice([None, rng.uniform(0.3, 6.0)])
        span = 3 * (profile.compute + start + 2)
        times = sorted(rng.uniform(0.0, span) for _ in range(rng.randint(0, 7)))
        args = {"interval": interval, "delay": 1.5, "times": times, "first_interval": first}
        fast, slow = run_once(profile, strategy, **args), _cell_by_cell(profile, strategy, **args)
        for field in ("billed", "finish", "lost"):
            assert getattr(fast, field) == pytest.approx(getattr(slow, field), abs=1e-6), (
                case,
                field,
                profile,
                strategy,
                args,
                fast,
                slow,
            )
        assert fast.preemptions == slow.preemptions, (case, profile, strategy, args)


def test_young_daly_is_the_simulations_best_interval() -> None:
    profile = Profile(tuple([2.0] + [10.0] * 20), 0.5, 2.0, 0.5).tiled(3 * 3600)
    assert 3 * 3600 <= profile.compute < 3 * 3600 + 10
    assert young_daly(0.5, 3600) == pytest.approx((2 * 0.5 * 3600) ** 0.5, rel=0.02)
    check = best_interval(profile, hazard_per_hour=1.0, delay=60.0, trials=200)
    assert check["cost_at_young_daly"] <= check["cost_at_best"] * 1.005
    resume = simulate(profile, "resume", hazard_per_hour=1.0, delay=60.0,
                      interval=check["young_daly_seconds"], trials=300)  # fmt: skip
    restart = simulate(profile, "restart", hazard_per_hour=1.0, delay=60.0, trials=300)
    assert 1.0 < resume.cost_ratio <= 1.15 < restart.cost_ratio
    assert 2.5 < resume.preemptions < 3.5  # one an hour over three hours


def test_a_profile_without_snapshots_says_its_snapshot_cost_is_an_estimate(work: Path) -> None:
    r = cli("run", "sleepy.ipynb", "--run-dir", "nosnap", "--snapshot", "off", cwd=work)
    assert r.returncode == 0, r.stderr
    sim = cli("simulate", "--from", "nosnap", "--duration", "1h", "--trials", "20", "--json",
              cwd=work)  # fmt: skip
    profile = json.loads(sim.stdout)["profile"]
    assert profile["snapshot_measured"] is False and profile["snapshot_seconds"] == 0.05
    text = cli("simulate", "--from", "nosnap", "--trials", "20", cwd=work).stdout
    assert "took no snapshot" in text and "--snapshot every-cell" in text
    r = cli("run", "sleepy.ipynb", "--run-dir", "snaps", "--snapshot", "every-cell", cwd=work)
    assert r.returncode == 0, r.stderr
    sim = cli("simulate", "--from", "snaps", "--trials", "20", "--json", cwd=work)
    assert json.loads(sim.stdout)["profile"]["snapshot_measured"] is True


# -- a real notebook, preempted on purpose ----------------------------------------------
TOLERANCE = 0.2  # measured billed time against the simulator's, for the same times


@pytest.mark.slow
def test_chaos_exits_1_and_names_each_strategy_whose_run_failed(work: Path) -> None:
    # a cell that passes once only (it appends to a file beside the notebook): the
    # baseline passes, then each strategy's run fails in its first attempt, before any
    # preemption; its cost compares nothing, and the command says so and exits 1
    mark = str(work / "ran-once")
    write_notebook(
        work / "once.ipynb",
        f"with open({mark!r}, 'a') as f:\n    f.write('x')\nassert open({mark!r}).read() == 'x'",
    )
    (work / "trace.txt").write_text("60\n")
    r = cli("chaos", "once.ipynb", "--trace", "trace.txt", "--work", "ch", "--json", cwd=work,
            timeout=600)  # fmt: skip
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert {n: s["exit_code"] for n, s in doc["strategies"].items()} == {"resume": 1, "restart": 1}
    for name in ("resume", "restart"):
        assert f"the {name} run failed (exit 1; its error is above)" in r.stderr, r.stderr


@pytest.mark.slow
def test_chaos_agrees_with_the_simulator(work: Path) -> None:
    # 12 cells of 0.5 s (6 s of sleeps) and kills 6 s apart: a restart (a start, 6 s of
    # cells, the output) never finishes between two; a resume gets 3-4.5 s of cells done
    # in the second gap and ends 1-3 s before the third kill, whatever its start costs
    # between 1 and 3 s. The kills are far from every attempt's end, so the count of
    # preemptions a real run meets is the simulator's on a slow machine or a fast one
    # (sleepy.ipynb's 4 s, killed at 2.5, 6.5 and 10.5 s, ended a resume 0.4 s before
    # the last kill: a slower start made it 3 preemptions, not 2)
    write_notebook(
        work / "twelve.ipynb",
        "import time\nn = 0",
        *["time.sleep(0.5)\nn += 1\nprint(n)"] * 12,
    )
    (work / "trace.txt").write_text("3\n9\n15\n")
    r = cli("chaos", "twelve.ipynb", "--trace", "trace.txt", "--delay", "0.5", "--work", "ch",
            "--json", cwd=work, timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    resume, restart = doc["strategies"]["resume"], doc["strategies"]["restart"]
    # a first attempt cut before it wrote run.json (a start slower than the first kill,
    # on a loaded machine) is started again by the same command, as a Job's pod is
    assert resume["exit_code"] == restart["exit_code"] == 0, doc
    assert resume["preemptions"] >= 1 and restart["preemptions"] == 3
    assert resume["cost_ratio"] < restart["cost_ratio"]
    for row in (resume, restart):
        # the simulator, fed the fastest and the slowest start, restore and finish the
        # runs met, and the snapshot points they took, brackets what they were billed: a
        # machine that slows down or speeds up while they go (other work on it) moves the
        # measured cost inside the band (with one median start, a loaded run's resume was
        # billed a third of the prediction; in another, 6.8 s against a band from 20.7 s,
        # where the snapshots fell then came from the baseline's profile alone)
        low, high = row["predicted_billed_seconds"]
        assert low <= high
        assert low * (1 - TOLERANCE) <= row["billed_seconds"] <= high * (1 + TOLERANCE), doc
        assert row["finish_seconds"] >= row["billed_seconds"] + row["waiting_seconds"] - 0.01
    assert RunStore(str(work / "ch" / "resume")).require_run()["status"] == "succeeded"
    sim = cli("simulate", "--from", str(work / "ch" / "baseline"), "--duration", "3h",
              "--hazard", "1/h", "--trials", "200", "--json", cwd=work)  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    rows = json.loads(sim.stdout)["strategies"]
    assert (
        rows["restart from scratch"]["cost_ratio"]
        > rows["resume, Young/Daly interval"]["cost_ratio"]
    )


# -- capacity fallback, on the fake API server ----------------------------------------
@pytest.mark.slow
def test_fallback_after_a_preemption_recreates_the_job_on_demand(
    work: Path, kube: FakeKube
) -> None:
    rd = f"file://{work}/runs/fb"
    waiter = start_cli(*submit_args(rd, "--wait", "--fallback-after-preemptions", "1"),
                       cwd=work, env=kube.env)  # fmt: skip
    (job,) = wait_for(lambda: kube.objects("jobs"), timeout=60, what="the Job")
    run_id = RunStore(rd).require_run()["spec"]["run_id"]
    env = {
        e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SPOTBOOK_CAPACITY"] == "spot" and env["SPOTBOOK_PROVIDER"] == "gke"
    kube.put("pods", pod("p1", run_id, "Running", node="gke-spot-1"))
    w1 = worker(work, rd, "p1", "gke-spot-1", kube, stopped=True)
    wait_for(lambda: len(RunStore(rd).cell_records()) >= 2, timeout=60, what="2 cells")
    code, err = kill(w1, signal.SIGTERM)
    assert code == 75, err
    kube.put("pods", disrupted("p1", run_id, "gke-spot-1", "TerminationByKubelet"))

    def capacity(j: dict[str, Any]) -> str | None:
        env = j["spec"]["template"]["spec"]["containers"][0]["env"]
        return next((e.get("value") for e in env if e["name"] == "SPOTBOOK_CAPACITY"), None)

    def on_demand() -> dict[str, Any] | None:
        return next((j for j in kube.objects("jobs") if capacity(j) == "on-demand"), None)

    new = wait_for(on_demand, timeout=60, what="the on-demand Job")
    assert new["metadata"]["name"] == job["metadata"]["name"]
    assert new["metadata"]["annotations"] == job["metadata"]["annotations"]  # same store
    new_env = {
        e["name"]: e.get("value") for e in new["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert new_env["SPOTBOOK_CAPACITY"] == "on-demand"
    affinity = json.dumps(new["spec"]["template"]["spec"].get("affinity"))
    # the same GPU, kept off spot nodes
    assert 'gke-spot", "operator": "NotIn"' in affinity and "nvidia-l4" in affinity
    assert 'gke-spot", "operator": "In"' in json.dumps(job["spec"]["template"]["spec"]["affinity"])
    record = RunStore(rd).read_json("job.json")
    assert "1 preemptions" in record["fallback"]["reason"]
    kube.put("pods", pod("p2", run_id, "Running", node="gke-od-1"))
    # the pod's variables from the new Job: this attempt runs on on-demand capacity
    w2 = start_cli(
        "worker", cwd=work,
        env={**kube.env, "SPOTBOOK_RUN_DIR": rd, "POD_NAME": "p2", "NODE_NAME": "gke-od-1",
             "POD_NAMESPACE": "default", "SPOTBOOK_CAPACITY": "on-demand",
             "SPOTBOOK_PROVIDER": "gke", "SPOTBOOK_MACHINE_TYPE": "g2-standard-8",
             "SPOTBOOK_REGION": "us-central1"},
    )  # fmt: skip
    _, err = w2.communicate(timeout=120)
    assert w2.returncode == 0, err
    kube.put(
        "pods", pod("p2", run_id, "Succeeded", node="gke-od-1", containerStatuses=terminated(0))
    )
    done = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    kube.set_status("jobs", "default", job["metadata"]["name"], done)
    _, werr = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, werr
    assert "falling back to on-demand nodes: 1 preemptions" in werr
    text = cli("status", rd, cwd=work, env=kube.env).stdout
    assert "capacity on-demand since" in text
    doc = json.loads(cli("cost", rd, "--json", cwd=work, env=kube.env).stdout)
    assert doc["attempts"][-1]["machine"]["capacity"] == "on-demand"
    assert doc["attempts"][-1]["cost"] == doc["attempts"][-1]["cost_on_demand"] is not None
    bad = cli(*submit_args(f"file://{work}/runs/x", "--on-demand", "--fallback-after-preemptions",
                           "2"), cwd=work, env=kube.env)  # fmt: skip
    assert bad.returncode == 2 and "is --on-demand" in bad.stderr


def test_the_fallback_policy_reads_the_jobs_view() -> None:
    from spotbook.kube.manifest import JobOptions
    from spotbook.ops.fallback import FallbackPolicy, options_from_json, options_to_json

    policy = FallbackPolicy(after_preemptions=2, after_pending=600)
    assert policy.reason({"preemptions": 1, "pods": []}, now=0) is None
    assert "2 preemptions" in (policy.reason({"preemptions": 2, "pods": []}, now=0) or "")
    waiting = {"preemptions": 0, "pods": [{"name": "p", "state": "pending",
                                            "created": "2026-12-01T00:00:00Z"}]}  # fmt: skip
    start = 1796083200.0  # 2026-12-01T00:00:00Z
    assert policy.reason(waiting, now=start + 599) is None
    assert "waited 600 s for a spot node" in (policy.reason(waiting, now=start + 600) or "")
    assert not FallbackPolicy().active
    with pytest.raises(UsageError):
        FallbackPolicy(after_preemptions=0)
    opts = JobOptions(run_id="r", run_dir="gs://b/r", image="i", env=(("A", "1"),), points=3)
    assert options_from_json(json.loads(json.dumps(options_to_json(opts)))) == opts


def _cell_by_cell(
    profile: Profile,
    strategy: str,
    *,
    interval: float | None,
    delay: float,
    times: Sequence[float],
    first_interval: float | None = None,
) -> Outcome:
    """The simulator as it was, one step per cell: slow (its cost grows with cells), and
    the reference the one that jumps from preemption to preemption must agree with."""
    out = Outcome()
    pending = list(times)

    def spend(cost: float) -> float | None:
        """Bill ``cost``; None if it completed, else the part done before a preemption."""
        if pending and out.billed + cost > pending[0]:
            at = pending.pop(0)
            part = max(at - out.billed, 0.0)
            out.billed = max(at, out.billed)
            return part
        out.billed += cost
        return None

    cells = profile.cells[:1] + profile.cells[1:] * profile.repeat
    snapshots = strategy == "resume" and interval is not None
    saved = 0  # cells a new attempt gets back (restored from the last snapshot)
    taken = 0  # snapshots so far: before the first, ``first_interval`` applies
    finished = False  # every cell committed (resume): what is left is saving the output
    while True:
        if finished:  # a resume with nothing to run starts no kernel
            tail = max(profile.start_seconds - profile.kernel_seconds, 0.0)
            if spend(tail + profile.finish_seconds) is None:
                break
            out.preemptions += 1
            out.finish += delay
            continue
        start = profile.start_seconds + (profile.restore_seconds if saved else 0.0)
        if spend(start) is not None:
            out.preemptions += 1
            out.finish += delay
            continue
        # since: compute since the last committed snapshot (a preemption loses it);
        # fresh: since the last one taken (the policy's clock)
        i, since, fresh, cut = saved, 0.0, 0.0, False
        pend: tuple[int, float, float] | None = None  # a background one: saves, commits at, covers

        def landed() -> None:
            nonlocal saved, since, pend
            if pend is not None and out.billed >= pend[1]:  # it committed before now
                saved, since, pend = pend[0], since - pend[2], None

        while i < len(cells):
            part = spend(cells[i])
            landed()
            due = (first_interval if taken == 0 and first_interval else interval) or 0.0
            if part is None and snapshots and i + 1 < len(cells) and fresh + cells[i] >= due:
                cut_short = None
                if pend is not None:  # one at a time: the cells wait for the one being written
                    cut_short = spend(max(pend[1] - out.billed, 0.0))
                    landed()
                if cut_short is None:
                    cut_short = spend(profile.snapshot_seconds)
                if cut_short is not None:  # the snapshot did not finish: the cell's work is lost
                    part = cells[i] + cut_short
                elif profile.write_seconds > 0:
                    since += cells[i]
                    pend = (i + 1, out.billed + profile.write_seconds, since)
                    fresh, i, taken = 0.0, i + 1, taken + 1
                    continue
                else:
                    saved, since, fresh, i, taken = i + 1, 0.0, 0.0, i + 1, taken + 1
                    continue
            if part is not None:
                out.lost += since + part
                cut = True
                break
            since += cells[i]
            fresh += cells[i]
            i += 1
        # the end waits for the last one being written
        if not cut and pend is not None and spend(max(pend[1] - out.billed, 0.0)) is not None:
            out.lost += since
            cut = True
        if not cut:
            if spend(profile.finish_seconds) is None:
                break
            # stopped while saving the output: spotbook has every cell committed; without
            # it the run starts over
            if strategy == "resume":
                finished = True
            else:
                out.lost += since
                saved = 0
        out.preemptions += 1
        out.finish += delay
    out.finish += out.billed
    return out


@pytest.mark.parametrize(
    ("numbers", "said"),
    [
        ({"delay": float("nan")}, "--delay must be a finite"),
        ({"interval": 0.0}, "--interval must be a positive"),
        ({"trials": 0}, "--trials must be 1 to 100000"),
        ({"duration": float("inf")}, "at most a year"),
        ({"hazard_per_hour": float("nan")}, "preemptions an hour"),
    ],
)
def test_the_library_call_checks_simulates_numbers_before_reading_the_run(
    tmp_path: Path, numbers: dict[str, Any], said: str
) -> None:
    """``spotbook simulate`` is one call, and a Python caller gets the command's checks:
    refused before the run is read (there is none here)."""
    asked: dict[str, Any] = {"hazard_per_hour": 1.0, "delay": 0.0, "trials": 10, **numbers}
    with pytest.raises(UsageError, match=said):
        simulate_run(RunStore(str(tmp_path / "none")), **asked)
