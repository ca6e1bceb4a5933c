"""Code that runs inside the user's kernel, and nothing else.

The runner reaches it through silent execute requests, so nothing here appears in
the notebook's outputs, history or execution count. It may import only the
standard library and cloudpickle: anything more (fsspec, cloud SDKs, nbclient)
would change what the notebook observes — warnings filters, ``sys.modules``,
library defaults decided at import time. The run store is the runner's business:
the kernel reads and writes blob files in one local directory the runner names.

- :mod:`.pickling` — the namespace as one pickle stream (shared references kept),
  with reducers that capture open files, SQLite connections, locks and array views
  instead of replaying the cells that made them.
- :mod:`.process_state` — the registry of process state outside the variables
  (cwd, ``sys.path``, environment, random generators, library options, IPython).
- :mod:`.session` — the entry points the runner calls: start-up hooks, snapshot,
  restore, per-cell effects.
- :mod:`.loops` — a cell's loops as resume points: the AST transformer, the checkpoint
  at an iteration boundary, going on from one.
"""
