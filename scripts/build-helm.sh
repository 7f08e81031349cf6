#!/usr/bin/env bash
# Build the helm CLI from Go modules, into a cache outside the clone.
#
#   scripts/build-helm.sh            # build (or find) helm, print its directory
#
# The version is pinned by tests/helm/go.mod (helm.sh/helm/v4; a module of its own, so its
# graph never moves tests/kube's pins). The binary lands in
#   ${SUNKD_KUBE_CACHE:-/var/cache/sunkd}/helm-<version>/bin/helm
# beside the Kubernetes binaries of scripts/build-kubernetes.sh. The script is idempotent:
# when helm is there and the VERSIONS stamp matches the pin it does nothing. It builds into
# a temporary directory beside the cache and renames it into place, so an interrupted build
# never leaves a half-filled cache. A lock serializes concurrent runs. The last line printed
# is the cache directory.
#
# Environment: SUNKD_KUBE_CACHE (cache root), GO (the go command), SUNKD_KUBE_FORCE=1
# (rebuild even when the cache is complete). A module needing a newer Go than the machine's
# needs GOTOOLCHAIN exported by the caller; the current pin builds with Go 1.26.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module_dir="$here/tests/helm"
module=helm.sh/helm/v4

say() { printf 'build-helm: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

GO="${GO:-}"
if [[ -z "$GO" ]]; then
    GO="$(command -v go || true)"
    [[ -n "$GO" ]] || { [[ -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go; }
fi
[[ -n "$GO" && -x "$GO" ]] || die "no go command found (install Go >= 1.26 or set GO=/path/to/go)"
[[ -f "$module_dir/go.mod" ]] || die "missing $module_dir/go.mod"

cd "$module_dir"
helm_version="$("$GO" list -m -f '{{.Version}}' "$module")" \
    || die "cannot read the $module pin from tests/helm/go.mod"
go_version="$("$GO" env GOVERSION)"

cache_root="${SUNKD_KUBE_CACHE:-/var/cache/sunkd}"
cache_parent="$cache_root/helm-$helm_version"
bin="$cache_parent/bin"
stamp="helm $helm_version"

complete() {
    [[ -x "$bin/helm" ]] || return 1
    [[ "$(cat "$bin/VERSIONS" 2>/dev/null)" == "$stamp"$'\n'* ]]
}

if [[ "${SUNKD_KUBE_FORCE:-0}" != 1 ]] && complete; then
    say "up to date: helm $helm_version"
    echo "$bin"
    exit 0
fi

mkdir -p "$cache_parent"
exec 9>"$cache_parent/.lock"
if command -v flock >/dev/null; then
    flock 9
    # Someone else may have finished the build while we waited for the lock.
    if [[ "${SUNKD_KUBE_FORCE:-0}" != 1 ]] && complete; then
        say "up to date: helm $helm_version"
        echo "$bin"
        exit 0
    fi
fi

tmp="$(mktemp -d "$cache_parent/.bin.tmp.XXXXXX")"
log="$(mktemp "${TMPDIR:-/tmp}/build-helm.XXXXXX.log")"
cleanup() { rm -rf "$tmp"; }
trap cleanup EXIT

# What upstream's Makefile sets for a tagged release, so `helm version` reports v4.X.Y
# instead of the source default "v4.X+unreleased". The module carries no git commit; the
# default Kubernetes version of `helm template` comes from the client-go version in the
# binary's build info, no flag needed.
vpkg="$module/internal/version"
ldflags="-s -w -X $vpkg.version=$helm_version -X $vpkg.metadata= -X $vpkg.gitTreeState=clean"

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
    die "go mod download failed in tests/helm (full log: $log)"
fi

say "building helm $helm_version with $go_version (cold: about 1.5 min on 2 cores)"
started=$SECONDS
export CGO_ENABLED=0
if ! "$GO" build -trimpath -ldflags="$ldflags" -o "$tmp/" "$module/cmd/helm" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    report_unserved "$log"
    die "go build failed (full log: $log)"
fi
rm -f "$log"
[[ -x "$tmp/helm" ]] || die "go build produced no helm"
reported="$("$tmp/helm" version --template '{{.Version}}')" || die "the built helm does not run"
[[ "$reported" == "$helm_version" ]] || die "the built helm reports $reported, expected $helm_version"
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
