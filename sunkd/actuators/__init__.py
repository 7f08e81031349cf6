"""Actuators: idempotent side effects on Slurm (drain/resume) and Kubernetes (taint, cordon, evict)."""
