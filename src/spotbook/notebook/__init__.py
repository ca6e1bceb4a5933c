"""Notebook documents, pure (no I/O beyond ``-f`` parameter files).

- :mod:`.document` — parse and check a notebook, inject parameters, assemble the
  output notebook with papermill's metadata and error banner.
- :mod:`.parameters` — papermill's parameter flags, Python rendering, ``inspect``.
- :mod:`.languages` — parameters written for each kernel language papermill knows.
"""
