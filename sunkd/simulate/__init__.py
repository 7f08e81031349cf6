"""`sunkd simulate`: sunkd's real policy on real workload traces, in virtual time.

Three arms run on the same window of the same traces: separate clusters, sunkd's pool
(the domain's `fold` and `decide` driving a modelled Slurm partition and Kubernetes),
and an ideal pool (instant, free moves). docs/evaluation.md describes the model, its
limits and the measured results. Imports only `sunkd.domain` and the standard library;
`traces` is the one module that reads files.
"""
