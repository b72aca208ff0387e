"""``python -m sitelens.cli``: the same as the ``sitelens`` console script."""

import sys

from sitelens.cli import main

sys.exit(main())
