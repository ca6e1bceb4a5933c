"""papermill's own tests, run with spotbook in papermill's place
(scripts/papermill_suite.py): every test passes but the ones named here, each for the
reason given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent

# test -> why it cannot pass under spotbook (or under papermill itself, here)
EXPECTED_FAILURES = {
    "test_execute.py": {
        # patch papermill's PapermillNotebookClient, an internal class
        "TestNotebookHelpers.test_start_timeout": "TypeError",
        "TestNotebookHelpers.test_default_start_timeout": "TypeError",
        # registers an engine in papermill's engine registry; spotbook has one engine and
        # refuses others by name
        "TestExecuteWithCustomEngine.test_custom_kernel_name_and_language": "engine_name",
        # imports IPython.core.display.display, gone from the IPython installed here:
        # papermill itself fails it too (scripts/papermill_suite.py --papermill)
        "TestBrokenNotebook2.test": "display_data",
    },
    "test_cli.py": {
        # --engine engine-that-could: spotbook refuses an engine it cannot honour (exit 2)
        "TestCLI.test_engine": "expected call not found",
        "TestCLI.test_many_args": "expected call not found",
        # patches execute_notebook to raise nbclient's DeadKernelError; spotbook's library
        # raises its own KernelDiedError, which the CLI maps to 138 (test_run_cli.py)
        "TestCLI.test_parameters_dead_kernel": "assert 1 == 138",
    },
    "test_inspect.py": {
        # spotbook also lists `d = a == 3`, which papermill's line parser skips
        "test_inspect_notebook[name2-expected2]": "assert {'msg'",
    },
}


def test_papermills_tests_pass_under_spotbook_but_the_named_ones() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "papermill_suite.py"), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    assert set(results) == set(EXPECTED_FAILURES)
    for file, tests in results.items():
        assert len(tests) > 5, file  # the file's tests were found and run
        failed = {name: why for name, why in tests.items() if why is not None}
        expected = EXPECTED_FAILURES[file]
        assert set(failed) == set(expected), (file, failed)
        for name, why in failed.items():
            assert expected[name] in why, (file, name, why)
