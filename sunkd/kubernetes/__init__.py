"""Everything sunkd knows about Kubernetes: the API client (kubeconfig, list-then-watch,
patches), Lease election, the source that turns Nodes, Pods and Nodesets into observation
events, the actuator (taints, sunkd's hold, evictions, Events) and the Nodeset status writer.
Imports `domain`, never `slurm`."""
