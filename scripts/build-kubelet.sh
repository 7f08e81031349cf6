#!/usr/bin/env bash
# Build the real kubelet from the control plane's Go module pins (tests/kube/go.mod), into
#   ${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/kubelet-<version>/bin/kubelet
# for the test bed's real kubelet Nodes (testbed/sunkd_testbed/kubelet.py; docs/kubernetes-build.md,
# "The real kubelet"). Idempotent, atomic and locked exactly like build-kubernetes.sh, whose
# `kubelet` target this is; the last line printed is the cache directory.
exec "$(dirname "${BASH_SOURCE[0]}")/build-kubernetes.sh" kubelet "$@"
