"""`python -m sunkd_testbed.kubeapi --port N ...`: same as `sunkd sim kubeapi`."""

from .cli import sync_main

raise SystemExit(sync_main())
