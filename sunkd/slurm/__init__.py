"""Everything sunkd knows about Slurm: the slurmrestd client (version negotiation, JWT,
errors), normalization of its three JSON families into `SlurmNode`/`SlurmJob`, the
poller that turns them into observation events, and the drain/undrain actuator (REST on
slurmrestd v0.0.39+, `scontrol` below that). Imports `domain`, never `kubernetes`."""
