"""Sources: turn Slurm and Kubernetes API state into normalized observation events."""
