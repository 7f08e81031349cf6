"""`python -m sunkd` is the `sunkd` command."""

import sys

from sunkd.cli import main

sys.exit(main())
