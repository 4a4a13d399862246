import sys

from recserve.mainjob.cli import main

sys.exit(main())
