#!/usr/bin/env bash
# Installs and starts what sunkd's tests and demo need from Debian when it is missing:
# the Slurm daemons and client, munge and the JWT plugin (the test harness starts its
# own private cluster from these binaries; nothing is configured system-wide), and a
# PostgreSQL reachable at SUNKD_TEST_DATABASE_URL's default 127.0.0.1:5432.
# Idempotent and quiet when everything is present. Needs root for apt-get.
set -euo pipefail

need_pkgs=()
for pair in slurmctld:slurmctld slurmd:slurmd slurmrestd:slurmrestd scontrol:slurm-client \
            munged:munge; do
  bin=${pair%%:*}; pkg=${pair#*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || need_pkgs+=("$pkg")
done
# The JWT auth plugin is a shared object, not a binary.
if ! ls /usr/lib/*/slurm-wlm/auth_jwt.so >/dev/null 2>&1; then
  need_pkgs+=(slurm-wlm-jwt-plugin)
fi

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-system-deps: need root to install: $*" >&2
    return 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "$@" >/dev/null 2>&1 || {
    apt-get update -q >/dev/null 2>&1
    apt-get install -y -q --no-install-recommends "$@" >/dev/null
  }
}

if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "ensure-system-deps: installing ${need_pkgs[*]}"
  apt_install "${need_pkgs[@]}" curl || echo "ensure-system-deps: could not install Slurm packages" >&2
fi

# The test bed's real kubelet Nodes (testbed/sunkd_testbed/kubelet.py): Debian 12's containerd
# 1.6 and runc, the CNI loopback plugin (a loopback-only network makes the runtime report
# NetworkReady; pods use the host network), a static busybox and debootstrap for the
# locally built test images (testbed/sunkd_testbed/images.py). No recommends: iptables is not
# needed (the kubelet runs with makeIPTablesUtilChains: false).
kube_pkgs=()
for pair in containerd:containerd runc:runc ctr:containerd debootstrap:debootstrap; do
  bin=${pair%%:*}; pkg=${pair#*:}
  command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || kube_pkgs+=("$pkg")
done
[ -x /usr/lib/cni/loopback ] || kube_pkgs+=(containernetworking-plugins)
[ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1 || kube_pkgs+=(busybox-static)
if [ ${#kube_pkgs[@]} -gt 0 ]; then
  mapfile -t kube_pkgs < <(printf '%s\n' "${kube_pkgs[@]}" | sort -u)
  echo "ensure-system-deps: installing ${kube_pkgs[*]}"
  apt_install "${kube_pkgs[@]}" || echo "ensure-system-deps: could not install ${kube_pkgs[*]}" >&2
fi

# Headless Chromium renders the status page in tests/integration/test_status_page.py.
if ! command -v chromium >/dev/null 2>&1; then
  echo "ensure-system-deps: installing chromium"
  apt_install chromium || echo "ensure-system-deps: could not install chromium" >&2
fi

# PostgreSQL: only when the default test URL is used and nothing answers there. The
# server may be missing (install it), installed but stopped (the polyglot machine kind),
# or running; in every case the test URL connects as postgres without a password from
# loopback, so the cluster gets one trust line for exactly that (Debian's default asks
# for a scram password on TCP).
if [ -z "${SUNKD_TEST_DATABASE_URL:-}" ]; then
  if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then
    if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
      echo "ensure-system-deps: installing postgresql"
      apt_install postgresql || true
    fi
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
      [ -f "$hba" ] || continue
      grep -q '^host all postgres 127.0.0.1/32 trust' "$hba" \
        || sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
    done
    for version_dir in /etc/postgresql/*; do
      [ -d "$version_dir/main" ] || continue
      echo "ensure-system-deps: starting PostgreSQL $(basename "$version_dir")/main"
      pg_ctlcluster --skip-systemctl-redirect "$(basename "$version_dir")" main start \
        || echo "ensure-system-deps: could not start PostgreSQL $(basename "$version_dir")" >&2
    done
    for _ in $(seq 1 50); do
      (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null && break
      sleep 0.2
    done
    # The default URL connects as postgres without a password to database "test".
    su postgres -c "psql -qtAc \"SELECT 1 FROM pg_database WHERE datname='test'\"" 2>/dev/null | grep -q 1 \
      || su postgres -c "createdb test" 2>/dev/null || true
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -qtAc 'SELECT 1' >/dev/null 2>&1; then
    # Running already, but without the trust line: add it and reload.
    for version_dir in /etc/postgresql/*; do
      hba="$version_dir/main/pg_hba.conf"
      [ -f "$hba" ] || continue
      grep -q '^host all postgres 127.0.0.1/32 trust' "$hba" \
        || sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
      pg_ctlcluster --skip-systemctl-redirect "$(basename "$version_dir")" main reload || true
    done
    sleep 0.5
    su postgres -c "createdb test" 2>/dev/null || true
  fi
  if ! psql -h 127.0.0.1 -U postgres -d test -qtAc 'SELECT 1' >/dev/null 2>&1; then
    echo "ensure-system-deps: PostgreSQL at 127.0.0.1:5432 does not let postgres into" \
         "database test without a password (see pg_hba.conf)" >&2
  fi
fi
exit 0
