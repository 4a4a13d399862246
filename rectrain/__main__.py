import sys

from rectrain.cli import main

sys.exit(main())
