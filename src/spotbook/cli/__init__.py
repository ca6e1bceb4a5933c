"""The ``spotbook`` command: parse, call the library, render, map errors to exit codes.

- :mod:`.main` — ``main``, the commands table and the exit-code table (the one place
  errors become exit codes).
- :mod:`.parser` — the argument parser: papermill's flags, spotbook's own.
- :mod:`.run` — run, resume, inspect and the container's worker.
- :mod:`.cluster` — submit, logs, cancel, recover.
- :mod:`.status` — status (store and cluster) and the runs table.
- :mod:`.drill` — preempt a run on purpose and follow its recovery.
- :mod:`.plans` — gke/eks/aks plan, up and down.
"""
