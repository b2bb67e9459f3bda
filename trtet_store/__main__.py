"""``python -m trtet_store``: the ``trtet-store`` command, as ``python -m trtet_store.cli``."""

import sys

from trtet_store.cli import main

sys.exit(main())
