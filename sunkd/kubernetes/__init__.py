"""Everything sunkd knows about Kubernetes: the API client (kubeconfig, list-then-watch,
patches), Lease election, the source that turns Nodes, Pods and Nodesets into observation
events, the actuator (taint, cordon, evict, Events) and the Nodeset status writer.
Imports `domain`, never `slurm`."""
