#!/usr/bin/env bash
# prepare-slurm-root.sh SUITE...  -  a minimal Debian SUITE root with Debian's own Slurm
# packages, for the test harness (testbed/sunkd_testbed/slurm.py, SlurmCluster(version=...)):
#
#   trixie (Debian 13) -> Slurm 24.11      sid -> Slurm 26.05
#   bookworm (Debian 12) -> Slurm 22.05, for hosts that are not Debian 12 and for the
#   slurmd image of the real kubelet Nodes (testbed/sunkd_testbed/images.py)
#
# The host's Debian 12 Slurm (22.05) needs no root. The root is built once per machine
# and cached OUTSIDE the clone:
#
#   ${SUNKD_SLURM_ROOT_CACHE:-/var/cache/sunkd}/slurm-root-SUITE/
#
# with a stamp file .sunkd-root.json (suite, Slurm release, package versions, mirror,
# recipe revision). A root whose stamp names this RECIPE is reused as it is; anything
# else is rebuilt. The build happens in a temporary directory beside it and is renamed
# into place only when complete, so a half-made root is never used; a failed build
# unmounts what it mounted and removes the temporary directory.
#
# Mirror: the Debian mirror this host's apt uses (/etc/apt/sources.list.d/*.sources,
# else /etc/apt/sources.list), override with SUNKD_DEBIAN_MIRROR. Needs root, network
# and debootstrap (installed with apt-get when missing). About 2 minutes per suite.
# Options: --force (rebuild even when up to date), --check (exit 0 if up to date, 1 if not;
# builds nothing), --check-plugins DIR (only check a slurm-wlm plugin directory as a finished
# root's is checked: exit 0 if the harness's plugins are there, 1 naming the first missing).
set -euo pipefail

RECIPE=2
# python3 (with its standard library): slurmctld runs `sunkd hook` (standard library only)
# as PrologSlurmctld/EpilogSlurmctld, and inside a root that is the root's interpreter.
PACKAGES=(slurmctld slurmd slurmrestd slurm-client munge slurm-wlm-jwt-plugin python3)

usage() { echo "usage: $0 [--force|--check] bookworm|trixie|sid... | --check-plugins DIR" >&2; exit 2; }

# The plugins the harness needs. REST: 23.02+ serve it through openapi/slurmctld, 22.05
# through openapi/v0.0.3x (and has no openapi/slurmctld).
check_plugins() {
  local dir=$1 plugin
  for plugin in auth_munge auth_jwt rest_auth_jwt rest_auth_local select_cons_tres; do
    [ -e "$dir/$plugin.so" ] || { echo "plugin $plugin.so missing in $dir" >&2; return 1; }
  done
  [ -e "$dir/openapi_slurmctld.so" ] || ls "$dir"/openapi_v0_0_3[0-9].so >/dev/null 2>&1 \
    || { echo "plugin openapi_slurmctld.so (or 22.05's openapi_v0_0_3x.so) missing in $dir" >&2; return 1; }
}
if [ "${1:-}" = --check-plugins ]; then
  [ $# = 2 ] || usage
  check_plugins "$2"
  exit
fi
force=0 check=0 suites=() opts=()
for arg in "$@"; do
  case "$arg" in
    --force) force=1; opts+=("$arg") ;;
    --check) check=1; opts+=("$arg") ;;
    bookworm|trixie|sid) suites+=("$arg") ;;
    *) usage ;;
  esac
done
[ ${#suites[@]} -gt 0 ] || usage
if [ ${#suites[@]} -gt 1 ]; then  # one run per suite; fails if any fails
  rc=0
  for suite in "${suites[@]}"; do "$0" "${opts[@]}" "$suite" || rc=1; done
  exit $rc
fi
suite=${suites[0]}

cache=${SUNKD_SLURM_ROOT_CACHE:-/var/cache/sunkd}
root=$cache/slurm-root-$suite
stamp=$root/.sunkd-root.json
say() { echo "prepare-slurm-root($suite): $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

up_to_date() {
  [ -f "$stamp" ] && grep -q "\"recipe\": $RECIPE," "$stamp" && [ -x "$root/usr/sbin/slurmrestd" ]
}
if [ $force = 0 ] && up_to_date; then
  [ $check = 1 ] || say "up to date: $root ($(sed -n 's/.*"slurm": "\([^"]*\)".*/Slurm \1/p' "$stamp"))"
  exit 0
fi
[ $check = 0 ] || exit 1

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, mount, chroot); run as root or use the host's Slurm 22.05 only"

# ---------------------------------------------------------------- mirror, debootstrap
mirror=${SUNKD_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }' \
    /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }' \
    /etc/apt/sources.list 2>/dev/null || true)
fi
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list; set SUNKD_DEBIAN_MIRROR"

if ! command -v debootstrap >/dev/null 2>&1; then
  say "installing debootstrap"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends debootstrap >/dev/null 2>&1 || {
    apt-get update -q >/dev/null 2>&1 || true
    apt-get install -y -q --no-install-recommends debootstrap >/dev/null
  } || die "cannot install debootstrap with apt-get"
fi

mkdir -p "$cache"
# One build per suite at a time (two `make test` runs on one machine).
exec 9>"$cache/.slurm-root-$suite.lock"
flock 9
if [ $force = 0 ] && up_to_date; then say "built meanwhile by another run: $root"; exit 0; fi

# ---------------------------------------------------------------- build in a temp dir
build=$(mktemp -d "$cache/.slurm-root-$suite.build.XXXXXX")
chmod 755 "$build"   # the root's / : munge, _apt and slurm must traverse it (mktemp makes 0700)
buildlog=$cache/slurm-root-$suite.build.log
: > "$buildlog"

mounted_under() { # mount points at or below $1, deepest first
  awk -v p="$1" '{ if ($5 == p || index($5, p "/") == 1) print $5 }' /proc/self/mountinfo | sort -r
}
kill_processes_in() { # processes whose root directory is $1 (started by apt in the build)
  local dir=$1 entry pid
  for entry in /proc/[0-9]*; do
    pid=${entry#/proc/}
    [ "$(readlink "$entry/root" 2>/dev/null)" = "$dir" ] || continue
    say "stopping pid $pid ($(cat "$entry/comm" 2>/dev/null)) left running inside the build root"
    kill -KILL "$pid" 2>/dev/null || true
  done
}
cleanup() {
  local rc=$? m
  kill_processes_in "$build"
  for m in $(mounted_under "$build"); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
  if [ -n "$(mounted_under "$build")" ]; then
    say "WARNING: still mounted under $build; not deleting it"
  else
    rm -rf --one-file-system "$build"
  fi
  [ $rc = 0 ] || say "FAILED (rc=$rc); log: $buildlog"
}
trap cleanup EXIT

started=$(date +%s)
say "debootstrap --variant=minbase $suite from $mirror (log: $buildlog)"
debootstrap --variant=minbase "$suite" "$build" "$mirror" >>"$buildlog" 2>&1 \
  || die "debootstrap failed (network? mirror $mirror has no $suite?); last lines:
$(tail -n 5 "$buildlog")"
boot_done=$(date +%s)

cp /etc/resolv.conf "$build/etc/resolv.conf"
# The host name must resolve without DNS (the harness also bind-mounts the host's file).
cp /etc/hosts "$build/etc/hosts"
# Maintainer scripts must not start daemons (munge's postinst would start munged).
printf '#!/bin/sh\nexit 101\n' > "$build/usr/sbin/policy-rc.d"
chmod 755 "$build/usr/sbin/policy-rc.d"
mount -t proc proc "$build/proc"
# A private /dev, never the host's: maintainer scripts run as root in here, and a bind of
# the host's /dev would let one of them change the host's device nodes (a host's
# /dev/null was once found mode 0644 after a build, which makes every non-root daemon
# abort on open). apt and dpkg need only these (the modes and numbers of devices.txt in
# the Linux kernel's documentation).
mount -t tmpfs -o mode=0755,nosuid dev-sunkd "$build/dev"
for node in "null c 1 3" "zero c 1 5" "full c 1 7" "random c 1 8" "urandom c 1 9" "tty c 5 0"; do
  set -- $node
  mknod -m 0666 "$build/dev/$1" "$2" "$3" "$4"
done
mkdir -m 1777 "$build/dev/shm"
mkdir -m 0755 "$build/dev/pts"
ln -s /proc/self/fd "$build/dev/fd"
mount --bind /sys "$build/sys"

in_root() { chroot "$build" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LC_ALL=C \
  DEBIAN_FRONTEND=noninteractive "$@"; }
# sid on a snapshot mirror: its Release file is past Valid-Until.
apt_opts=(-o Acquire::Check-Valid-Until=false -o Acquire::Retries=3)
say "apt-get install ${PACKAGES[*]}"
in_root apt-get "${apt_opts[@]}" update -q >>"$buildlog" 2>&1 || die "apt-get update in the root failed; last lines:
$(tail -n 5 "$buildlog")"
in_root apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$buildlog" 2>&1 \
  || die "apt-get install in the root failed; last lines:
$(tail -n 5 "$buildlog")"
in_root apt-get clean >>"$buildlog" 2>&1 || true
# slurmrestd refuses root, and 26.05's refuses `nobody` ("Unable to resolve user").
in_root sh -c 'id slurmrest >/dev/null 2>&1 || useradd -r -M -d /nonexistent -s /usr/sbin/nologin slurmrest' \
  >>"$buildlog" 2>&1 || die "useradd slurmrest failed"

release=$(in_root slurmctld -V 2>/dev/null | awk '{print $2}')
[ -n "$release" ] || die "slurmctld -V does not run inside the root"
plugdir=$(ls -d "$build"/usr/lib/*/slurm-wlm 2>/dev/null | head -1)
check_plugins "$plugdir" || die "the root lacks a plugin the harness needs"
parsers=$(cd "$plugdir" && ls data_parser_v0_0_*.so 2>/dev/null | sed 's/data_parser_\(v0_0_[0-9]*\)\.so/\1/; s/_/./g' | sort -V | tr '\n' ' ' || true)
versions=$(in_root dpkg-query -W -f '"${Package}": "${Version}", ' "${PACKAGES[@]}" | sed 's/, $//')
cat > "$build/.sunkd-root.json" <<EOF
{"recipe": $RECIPE, "suite": "$suite", "slurm": "$release", "rest_data_parsers": "${parsers% }",
 "packages": {$versions}, "mirror": "$mirror", "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
 "debootstrap_seconds": $((boot_done - started)), "apt_seconds": $(( $(date +%s) - boot_done ))}
EOF

kill_processes_in "$build"
for m in $(mounted_under "$build"); do umount "$m"; done
[ -z "$(mounted_under "$build")" ] || die "could not unmount everything under $build"

# ---------------------------------------------------------------- swap into place
if [ -e "$root" ]; then
  [ -z "$(mounted_under "$root")" ] || die "$root is in use (mounts below it: a cluster is running from it); stop it first"
  old=$(mktemp -d "$cache/.slurm-root-$suite.old.XXXXXX")
  mv "$root" "$old/root"
  mv "$build" "$root"
  rm -rf --one-file-system "$old"
else
  mv "$build" "$root"
fi
chmod 755 "$root"
say "ready: $root (Slurm $release, REST data parsers ${parsers% }) in $(( $(date +%s) - started )) s"
