"""``python -m schedkit.cli``: the ``schedkit`` command."""

import sys

from schedkit.cli import main

sys.exit(main())
