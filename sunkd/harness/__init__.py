"""Harnesses that start *real* peers (a private Slurm cluster from Debian's packages)
for tests, benchmarks and the demo. Nothing here is used by the daemon in production."""
