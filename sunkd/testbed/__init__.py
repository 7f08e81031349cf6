"""For trying and testing sunkd, never for production: a private real Slurm cluster from
Debian's packages (`slurm`), the Kubernetes API emulator (`kubeapi`; not a real API
server), the real Kubernetes control plane built from Go modules (`kubernetes`) and the
demo that puts them together. `sunkd run` imports nothing from here."""
