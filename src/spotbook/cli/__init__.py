"""The ``spotbook`` command: parse, call the library, render, map errors to exit codes.

- :mod:`.main` — the parser, the commands and the exit-code table.
"""
