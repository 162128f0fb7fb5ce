"""`python -m batchinfer.cli` (what ./batchctl runs)."""

import sys

from . import main

sys.exit(main())
