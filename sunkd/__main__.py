"""`python -m sunkd` is the `sunkd` command."""

import sys

from sunkd.cli.main import main

sys.exit(main())
