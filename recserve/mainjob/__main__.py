"""``python -m recserve.mainjob`` (``./run.sh``): the same as ``recserve main``."""

import sys

from recserve.cli import main

sys.exit(main(["main", *sys.argv[1:]]))
