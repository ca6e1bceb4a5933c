"""Write docker/spotbook-requirements.txt: every package the worker images install for
spotbook itself (its dependencies and the gcs, s3 and azure extras), pinned, resolved
for the images' Python (3.12) by pip's own resolver.

    .venv/bin/python scripts/lock_image_deps.py

The images install this file before copying spotbook's source, so a change to the source
rebuilds one small layer, and every build of a commit gets the same libraries.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docker" / "spotbook-requirements.txt"
PYTHON = "3.12"
EXTRAS = "gcs,s3,azure"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--dry-run",
                "--ignore-installed",
                "--only-binary=:all:",
                "--python-version",
                PYTHON,
                "--target",
                str(Path(tmp) / "t"),
                "--report",
                str(report),
                f"{ROOT}[{EXTRAS}]",
            ],
            check=True,
        )
        items = json.loads(report.read_text())["install"]
    pins = sorted(
        (i["metadata"]["name"].lower(), i["metadata"]["version"])
        for i in items
        if i["metadata"]["name"].lower() != "spotbook"
    )
    lines = [
        "# spotbook's own dependencies with the gcs, s3 and azure extras, pinned for the",
        f"# worker images (Python {PYTHON}). Written by scripts/lock_image_deps.py; do not edit.",
        *(f"{name}=={version}" for name, version in pins),
    ]
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(pins)} pins to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
