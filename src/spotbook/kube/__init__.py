"""Kubernetes: everything ``submit`` and the cluster commands need (the ``kube`` extra).

- :mod:`.manifest` — the Job that runs one spotbook worker, as plain dicts (no I/O).
- :mod:`.cluster` — talking to a cluster (lightkube): create, find, follow, delete.
- :mod:`.jobs` — where a Job and its pods stand, derived from what the API returns.
- :mod:`.plans` — cluster setup plans for GKE, EKS and AKS (the exact commands).
- :mod:`.gpus` — which machine carries which GPUs, per cloud.
"""
