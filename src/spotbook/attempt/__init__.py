"""One attempt at a run, on the runner's side of the kernel: start the kernel, restore
the state, run the cells, commit each, stop on a notice.

- :mod:`.runner` — the attempt: claim, restore, the cell loop, commits, the end.
- :mod:`.executor` — one kernel, one cell at a time (nbclient, jupyter_client).
- :mod:`.replay` — the pure replay planner: which finished cells to run again and
  what may differ.
- :mod:`.fidelity` — the fidelity report of a resume.
- :mod:`.environment` — where the attempt runs (host, pod, node, GPUs).
- :mod:`.progress` — papermill's progress bar.
- :mod:`.in_cell` — checkpoints inside a cell (a loop's iteration boundary) and going
  on from one.

Code that runs *inside* the kernel is in :mod:`spotbook.kernel`, never here.
"""
