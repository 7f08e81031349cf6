"""For trying and testing sunkd, never for production, and therefore not in sunkd's wheel
or container image: a private real Slurm cluster from Debian's packages (`slurm`), the
Kubernetes API emulator (`kubeapi`; not a real API server) and a fake slurmrestd
(`slurmrestd`; not the real one) for the faults real servers cannot be made to show, the
real Kubernetes control plane and kubelet built from Go modules (`kubernetes`, `kubelet`,
`containerd`, `images`) and the demo that puts them together.

Installed with `pip install 'sunkd[testbed]'` beside sunkd (from a clone:
`pip install -e . -e ./testbed`); `make demo` and `make test` do it. `sunkd run` imports
nothing from here."""
