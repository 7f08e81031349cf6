"""API clients: slurmrestd (version negotiation, auth, normalization) and Kubernetes
(list+watch)."""
