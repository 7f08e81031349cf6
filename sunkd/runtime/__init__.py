"""The process: settings, logging, the daemon (leadership, signals, systemd, HTTP), the
engine that folds the log and runs the policy, and the executor that carries out the
outbox through the Slurm and Kubernetes actuators. The only package that wires the two
external systems together."""
