"""``python -m trio_dispatch._cli``: the ``trio-dispatch`` command."""

import sys

from ._main import main

sys.exit(main())
