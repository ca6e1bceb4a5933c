"""Runs to look at in a browser: the HTML report of one run (``spotbook report``) and the
local dashboard (``spotbook ui``).

- :mod:`.timeline` — the attempts, their restores and redone compute, and the downtime
  between them, drawn as inline SVG from the status document.
- :mod:`.report` — one run's summary and its notebook rendered by nbconvert, as a page
  that loads nothing from anywhere.
- :mod:`.dashboard` — the web app: runs and sweeps from local and object stores and the
  cluster, each run's live progress.

Everything here reads runs through the library's public calls (``run_status``,
``run_notebook``, ``run_logs``, ``find_runs``, ``run_cost``), never the store's files.
"""
