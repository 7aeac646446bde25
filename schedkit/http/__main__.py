"""``python -m schedkit.http``: the front-end process (configuration as JSON on stdin)."""

import sys

from schedkit.http.server import main

sys.exit(main())
