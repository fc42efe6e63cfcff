"""``python -m response_compaction``: the same as the ``response-compaction`` command."""

import sys

from ._cli import main

sys.exit(main())
