"""Talking to a Kubernetes cluster (lightkube): create, find, follow and delete run Jobs.

The only module that imports lightkube. Configuration is found as kubectl finds it: the
in-cluster service account, else ``KUBECONFIG`` (first file of the list) or
``~/.kube/config``, with ``--context`` choosing a context and the context's namespace as
the default namespace. API errors become :class:`ClusterError` with what to do.
"""

from __future__ import annotations

import base64
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .._errors import ClusterError, UsageError
from ..store.integrity import Key
from .manifest import CONTAINER, KEY_SECRET_ITEM, LABEL_MANAGED, LABEL_RUN, job_name

log = logging.getLogger(__name__)
T = TypeVar("T")
_RETRIES = 4


def _answer(exc: Any) -> tuple[int, str]:
    """HTTP code and message of an error answer: the API server's Status when it sent
    one (lightkube's ApiError), else the bare HTTP answer (a proxy's error page)."""
    from lightkube import ApiError

    if isinstance(exc, ApiError):
        return exc.status.code or 0, exc.status.message or str(exc)
    return exc.response.status_code, exc.response.reason_phrase or "error"


def _kubeconfig_path() -> str:
    paths = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for p in paths:
        if os.path.exists(p):
            return p
    return os.path.expanduser("~/.kube/config")


@dataclass
class Cluster:
    """A lightkube client for one context and namespace (None: the kubeconfig's, then
    "default"; after construction it is always a name)."""

    context: str | None = None
    namespace: str = ""

    def __post_init__(self) -> None:
        try:
            from lightkube import Client, KubeConfig
            from lightkube.core.exceptions import ConfigError
        except ImportError as exc:
            raise UsageError(
                "the cluster commands need the Kubernetes client: pip install '.[kube]' in "
                "the spotbook folder"
            ) from exc

        try:
            if self.context is None:
                config = KubeConfig.from_env(default_config=_kubeconfig_path())
            else:
                config = KubeConfig.from_file(_kubeconfig_path())
            single = config.get(context_name=self.context)
        except (ConfigError, OSError) as exc:
            raise UsageError(
                f"no usable Kubernetes configuration ({exc}); point KUBECONFIG at a "
                "kubeconfig (e.g. `gcloud container clusters get-credentials CLUSTER`), "
                "choose a context with --context, or run inside a cluster"
            ) from exc
        assert single is not None
        self.namespace = self.namespace or single.namespace or "default"
        self.server = single.cluster.server
        self.context_name = single.context_name
        self.client = Client(config=single, namespace=self.namespace, field_manager="spotbook")

    def close(self) -> None:
        """Close the connections to the API server (a library caller's process goes on)."""
        self.client.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- errors ----------------------------------------------------------------
    def _call(self, what: str, op: Callable[[], T], *, retry: bool = True) -> T:
        import httpx2 as httpx

        for attempt in range(1, _RETRIES + 1):
            try:
                return op()
            except httpx.HTTPStatusError as exc:  # lightkube's ApiError is one too
                code, message = _answer(exc)
                if retry and code >= 500 and attempt < _RETRIES:
                    log.warning("%s: API server answered %d; retrying", what, code)
                    time.sleep(0.3 * 2**attempt)
                    continue
                raise self._explain(what, code, message) from None
            except httpx.TransportError as exc:
                if retry and attempt < _RETRIES:
                    time.sleep(0.3 * 2**attempt)
                    continue
                raise ClusterError(
                    f"cannot reach the Kubernetes API at {self.server} ({exc}); check "
                    f"`kubectl --context {self.context_name} get nodes` works"
                ) from None
        raise AssertionError("unreachable")

    def _explain(self, what: str, code: int, message: str) -> ClusterError:
        where = f"namespace {self.namespace!r} (context {self.context_name!r})"
        if code == 401:
            hint = "the cluster rejected the credentials; refresh them (get-credentials)"
        elif code == 403:
            hint = (
                f"your account may not do this in {where}; check with "
                f"`kubectl auth can-i create jobs -n {self.namespace}`"
            )
        elif code == 404:
            hint = f"not found in {where}; check --namespace and --context"
        elif code == 409:
            hint = "it already exists (was this run submitted before? see `spotbook status`)"
        elif code == 422:
            hint = "the API server refused the manifest; see `spotbook submit --dry-run -o yaml`"
        elif code >= 500:
            hint = "the API server failed; try again shortly"
        else:
            hint = f"in {where}"
        return ClusterError(f"{what}: {message} (HTTP {code}); {hint}")

    # -- Jobs ------------------------------------------------------------------
    def create_job(self, manifest: dict[str, Any], *, dry_run: bool = False) -> dict[str, Any]:
        """Create the Job; ``dry_run``: only ask the API server whether it would (its
        own validation and admission, ``dryRun=All``), creating nothing."""
        from lightkube import codecs

        obj = codecs.from_dict(manifest)
        name = manifest["metadata"]["name"]
        what = (
            f"check Job {name} with the API server (a dry run)" if dry_run else f"create Job {name}"
        )
        created = self._call(what, lambda: self.client.create(obj, dry_run=dry_run), retry=False)
        out: dict[str, Any] = created.to_dict()
        return out

    def get_job(self, run_id: str) -> dict[str, Any] | None:
        """The run's Job, or None if there is none (never submitted, or cleaned up)."""
        from lightkube import ApiError
        from lightkube.resources.batch_v1 import Job

        name = job_name(run_id)

        def get() -> dict[str, Any] | None:
            try:
                out: dict[str, Any] = self.client.get(Job, name, namespace=self.namespace).to_dict()
                return out
            except ApiError as exc:
                if exc.status.code == 404:
                    return None
                raise

        return self._call(f"get Job {name}", get)

    def list_jobs(self, all_namespaces: bool = False) -> list[dict[str, Any]]:
        from lightkube import ALL_NS
        from lightkube.resources.batch_v1 import Job

        ns = ALL_NS if all_namespaces else self.namespace
        return self._call(
            "list Jobs",
            lambda: [
                j.to_dict()
                for j in self.client.list(Job, namespace=ns, labels={LABEL_MANAGED: "spotbook"})
            ],
        )

    def pods(self, run_id: str) -> list[dict[str, Any]]:
        """The run's pods, oldest first."""
        from lightkube.resources.core_v1 import Pod

        pods = self._call(
            "list pods",
            lambda: [
                p.to_dict()
                for p in self.client.list(Pod, namespace=self.namespace, labels={LABEL_RUN: run_id})
            ],
        )
        return sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")

    def delete_job(self, run_id: str) -> None:
        from lightkube.resources.batch_v1 import Job
        from lightkube.types import CascadeType

        name = job_name(run_id)
        self._call(
            f"delete Job {name}",
            lambda: self.client.delete(
                Job, name, namespace=self.namespace, cascade=CascadeType.BACKGROUND
            ),
        )

    def run_key(self, secret: str, local: Key) -> Key:
        """The run key kept in the Secret ``secret``: reused if it exists, else created
        from ``local`` (so this machine can resume the runs it submits)."""
        from lightkube import ApiError
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Secret

        def get() -> Any:
            try:
                return self.client.get(Secret, secret, namespace=self.namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    return None
                raise

        found = self._call(f"get Secret {secret}", get)
        if found is None:
            body = Secret(
                metadata=ObjectMeta(
                    name=secret,
                    namespace=self.namespace,
                    labels={LABEL_MANAGED: "spotbook"},
                ),
                type="Opaque",
                data={KEY_SECRET_ITEM: base64.b64encode(local.secret).decode()},
            )
            self._call(f"create Secret {secret}", lambda: self.client.create(body), retry=False)
            log.info("created Secret %s in namespace %s with the run key", secret, self.namespace)
            return local
        data = (found.data or {}).get(KEY_SECRET_ITEM)
        if not data:
            raise UsageError(
                f"Secret {secret!r} in namespace {self.namespace!r} has no {KEY_SECRET_ITEM!r} "
                f"item; delete it (spotbook creates it) or name another with --key-secret"
            )
        key = Key(base64.b64decode(data).strip(), f"Secret {self.namespace}/{secret}")
        if key.id != local.id:
            log.warning(
                "the run key in Secret %s differs from this machine's (%s): this run can be "
                "resumed here only with SPOTBOOK_SNAPSHOT_KEY set to the Secret's key",
                secret,
                local.source,
            )
        return key

    def evict(self, pod: str) -> None:
        """Evict a pod through the Eviction API: what a drain or the autoscaler does."""
        from lightkube.models.meta_v1 import ObjectMeta
        from lightkube.resources.core_v1 import Pod

        body = Pod.Eviction(metadata=ObjectMeta(name=pod, namespace=self.namespace))
        self._call(
            f"evict pod {pod}",
            lambda: self.client.create(body, name=pod, namespace=self.namespace),
            retry=False,
        )

    def force_delete_pod(self, pod: str) -> None:
        """Delete a pod with grace 0: the API forgets it without waiting for its kubelet
        (a node that died cannot confirm the pod stopped)."""
        from lightkube.resources.core_v1 import Pod

        self._call(
            f"delete pod {pod}",
            lambda: self.client.delete(Pod, pod, namespace=self.namespace, grace_period=0),
            retry=False,
        )

    def node_ready(self, node: str) -> bool | None:
        """Whether a node reports Ready (a node that is gone is not); None when this
        account may not read nodes (namespace-scoped roles often may not)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Node

        def get() -> bool | None:
            try:
                obj = self.client.get(Node, node)
            except ApiError as exc:
                if exc.status.code == 404:
                    return False
                if exc.status.code == 403:
                    return None
                raise
            conditions = (obj.status.conditions if obj.status else None) or []
            return any(c.type == "Ready" and c.status == "True" for c in conditions)

        return self._call(f"get node {node}", get)

    def provider_id(self, node: str) -> str:
        """A node's spec.providerID: ``gce://PROJECT/ZONE/INSTANCE``, ``aws:///ZONE/ID``,
        ``azure:///subscriptions/...``."""
        from lightkube.resources.core_v1 import Node

        obj = self._call(f"get node {node}", lambda: self.client.get(Node, node))
        return str((obj.spec.providerID if obj.spec else None) or "")

    def logs(self, pod: str, follow: bool = False) -> Iterator[str]:
        import httpx2 as httpx

        what = f"logs of pod {pod}"
        try:
            yield from self.client.log(
                pod, namespace=self.namespace, container=CONTAINER, follow=follow
            )
        except httpx.HTTPStatusError as exc:
            raise self._explain(what, *_answer(exc)) from None
        except httpx.HTTPError as exc:
            raise ClusterError(f"{what}: {exc}") from None

    def watch_job(self, run_id: str, timeout: int = 60) -> Iterator[tuple[str, dict[str, Any]]]:
        """Changes to the run's Job, forever: re-lists when the watch expires (410)."""
        from lightkube import ApiError
        from lightkube.resources.batch_v1 import Job

        name = job_name(run_id)
        version: str | None = None
        while True:
            if version is None:
                job = self.get_job(run_id)
                if job is None:
                    raise ClusterError(f"Job {name} is gone from namespace {self.namespace!r}")
                version = job["metadata"].get("resourceVersion")
                yield "SYNC", job
            try:
                for kind, obj in self.client.watch(
                    Job,
                    namespace=self.namespace,
                    fields={"metadata.name": name},
                    server_timeout=timeout,
                    resource_version=version,
                ):
                    data: dict[str, Any] = obj.to_dict()
                    version = data["metadata"].get("resourceVersion") or version
                    yield kind, data
            except ApiError as exc:
                if exc.status.code == 410:
                    log.debug("watch of Job %s expired; listing again", name)
                    version = None
                    continue
                raise self._explain(f"watch Job {name}", exc.status.code or 0, str(exc)) from None
            except Exception as exc:
                import httpx2 as httpx

                if isinstance(exc, httpx.TransportError | httpx.StreamError):
                    time.sleep(1.0)
                    version = None
                    continue
                raise
