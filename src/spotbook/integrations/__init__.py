"""spotbook inside the tools people already run notebooks with: a papermill engine
(``papermill_engine``, registered by the ``papermill.engine`` entry point) and a
jupyter-scheduler backend (``jupyter_scheduler``, named in the Jupyter server's config)."""
