"""The run store: one layout on any fsspec URL, and what vouches for it.

- :mod:`.runstore` — the layout (run.json, input/output notebooks, cell records,
  attempts, snapshots), local and object-store backends, the fence (exclusive creates),
  retries.
- :mod:`.integrity` — the run key and the seal: nothing in a bucket is loaded unless
  it is sealed with the key (never in the store).
- :mod:`.checkpoints` — the notebook's checkpoint directory, kept in an object store.
"""
