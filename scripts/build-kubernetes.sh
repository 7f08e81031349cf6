#!/usr/bin/env bash
# Build the real Kubernetes control plane from Go modules, into a cache outside the clone.
#
#   scripts/build-kubernetes.sh            # build (or find) the binaries, print their directory
#   scripts/build-kubernetes.sh kubelet    # the kubelet, same pins, own cache (build-kubelet.sh)
#
# Versions are pinned by tests/kube/go.mod (k8s.io/kubernetes, its staging modules through
# `replace`, and go.etcd.io/etcd/server/v3); the binaries are kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl and etcd. They land in
#   ${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/kubernetes-<version>/bin
# With the argument `kubelet` it builds k8s.io/kubernetes/cmd/kubelet from the same module
# into ${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/kubelet-<version>/bin instead (its own cache
# and lock, so it never waits on or disturbs a control-plane build; with the control plane
# already compiled, GOCACHE holds all but ~100 of its packages).
# The script is idempotent: when every binary is there and the VERSIONS stamp matches the
# pins it does nothing. It builds into a temporary directory beside the cache and renames
# it into place, so an interrupted build never leaves a half-filled cache. A lock serializes
# concurrent runs. The last line printed is the cache directory.
#
# Environment: SUNKD_KUBE_CACHE (cache root), GO (the go command), SUNKD_KUBE_FORCE=1
# (rebuild even when the cache is complete). A module needing a newer Go than the machine's
# needs GOTOOLCHAIN exported by the caller; the current pins build with Go 1.26.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$here/tests/kube"
target="${1:-kubernetes}"
case "$target" in
    kubernetes)
        binaries=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)
        packages=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
                  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
                  go.etcd.io/etcd/server/v3) ;;
    kubelet)
        binaries=(kubelet)
        packages=(k8s.io/kubernetes/cmd/kubelet) ;;
    *) printf 'usage: %s [kubernetes|kubelet]\n' "$0" >&2; exit 2 ;;
esac

say() { printf 'build-kubernetes: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

GO="${GO:-}"
if [[ -z "$GO" ]]; then
    GO="$(command -v go || true)"
    [[ -n "$GO" ]] || { [[ -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go; }
fi
[[ -n "$GO" && -x "$GO" ]] || die "no go command found (install Go >= 1.26 or set GO=/path/to/go)"
[[ -f "$module_dir/go.mod" ]] || die "missing $module_dir/go.mod"

cd "$module_dir"
pinned() { "$GO" list -m -f '{{.Version}}' "$1"; }
kube_version="$(pinned k8s.io/kubernetes)" || die "cannot read the k8s.io/kubernetes pin from tests/kube/go.mod"
etcd_version="$(pinned go.etcd.io/etcd/server/v3)" || die "cannot read the go.etcd.io/etcd/server/v3 pin"
go_version="$("$GO" env GOVERSION)"

cache_root="${SUNKD_KUBE_CACHE:-/var/cache/sunkd}"
cache_parent="$cache_root/$target-$kube_version"
bin="$cache_parent/bin"
if [[ "$target" == kubelet ]]; then
    stamp="kubelet $kube_version"
else
    stamp="kubernetes $kube_version
etcd $etcd_version"
fi

complete() {
    local b
    for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || return 1; done
    [[ "$(cat "$bin/VERSIONS" 2>/dev/null)" == "$stamp"* ]]
}

if [[ "${SUNKD_KUBE_FORCE:-0}" != 1 ]] && complete; then
    say "up to date: ${stamp//$'\n'/, }"
    echo "$bin"
    exit 0
fi

mkdir -p "$cache_parent"
exec 9>"$cache_parent/.lock"
if command -v flock >/dev/null; then
    flock 9
    # Someone else may have finished the build while we waited for the lock.
    if [[ "${SUNKD_KUBE_FORCE:-0}" != 1 ]] && complete; then
        say "up to date: ${stamp//$'\n'/, }"
        echo "$bin"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_parent/.bin.tmp.XXXXXX")"
log="$(mktemp "${TMPDIR:-/tmp}/build-kubernetes.XXXXXX.log")"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT

# The version variables upstream's hack/lib/version.sh sets, so `kubectl version` and
# /version report v1.X.Y instead of v0.0.0-master. The build date is the module's commit
# time, so two builds of one pin are byte-identical.
minor="${kube_version#v1.}"; minor="${minor%%.*}"
build_date="$("$GO" list -m -f '{{with .Time}}{{.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)"
ldflags="-s -w"
for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
done

# Modules the proxy does not serve: go says "<module>@<version>: reading <url>: 404 Not
# Found" (or "(replaced by <module>@<version>): reading ..."); the module named right before
# ": reading" is the exact one to report.
report_unserved() {
    local found
    found="$(sed -nE 's#(^|.*[ (\t])([^ (\t]+@[^ :)]+)\)?: reading [^ ]+: ([0-9]{3}.*)#\2 (\3)#p' "$1" \
        | sort -u)"
    [[ -n "$found" ]] || return 0
    while IFS= read -r line; do say "module not served by the Go module proxy: $line"; done <<<"$found"
}

# Fetch every module first (a no-op when GOMODCACHE has them), so a module that is not
# served is named before anything is compiled.
if ! "$GO" mod download >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    report_unserved "$log"
    die "go mod download failed in tests/kube (full log: $log)"
fi

say "building ${stamp//$'\n'/ and } with $go_version (cold: 6-8 min on 2 cores; the kubelet after the control plane: ~30 s)"
started=$SECONDS
export CGO_ENABLED=0
if ! "$GO" build -trimpath -ldflags="$ldflags" -o "$tmp/" "${packages[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    report_unserved "$log"
    die "go build failed (full log: $log)"
fi
rm -f "$log"
# `go build -o dir/` names go.etcd.io/etcd/server/v3's main package "server".
if [[ "$target" == kubernetes ]]; then
    [[ -x "$tmp/server" ]] || die "go build produced no etcd (expected $tmp/server)"
    mv "$tmp/server" "$tmp/etcd"
fi
for b in "${binaries[@]}"; do [[ -x "$tmp/$b" ]] || die "go build produced no $b"; done
printf '%s\ngo %s\n' "$stamp" "$go_version" >"$tmp/VERSIONS"
chmod 0755 "$tmp"

# Swap the finished directory in. rename(2) of a directory onto a non-empty one fails, so a
# stale bin/ is moved aside first and removed afterwards.
if [[ -e "$bin" ]]; then
    old="$(mktemp -d "$cache_parent/.bin.old.XXXXXX")"
    mv -T "$bin" "$old/bin"
    mv -T "$tmp" "$bin"
    rm -rf "$old"
else
    mv -T "$tmp" "$bin"
fi
say "built in $((SECONDS - started)) s: $(du -sh "$bin" | cut -f1) in $bin"
echo "$bin"
