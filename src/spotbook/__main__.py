"""``python -m spotbook``: the ``spotbook`` command."""

import sys

from .cli.main import main

sys.exit(main())
