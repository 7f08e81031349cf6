"""The `sunkd` command line, one module per command group: `main` (parser, entry point),
`log` (migrate, events), `operator` (status, pin, replay), `audit` (history, audit) and
`doctor`. `run` lives with the daemon and `demo`/`sim` with the testbed."""
