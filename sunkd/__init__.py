"""sunkd: one compute pool shared by Slurm and Kubernetes."""

__version__ = "0.1.0"
