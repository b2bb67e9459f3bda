"""``python -m trtet_store.cli``: the ``trtet-store`` console script."""

import sys

from trtet_store.cli import main

sys.exit(main())
