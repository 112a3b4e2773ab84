#!/usr/bin/env bash
# Build the real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler) and etcd from Go modules, once per machine, into
#   .tools/kube/<k8s version>/bin/
# with SHA256SUMS and build-times.txt next to the binaries. Versions are pinned by
# scripts/kube/go.mod and scripts/kube/etcd/go.mod (+ go.sum). A binary that is
# already there is not rebuilt; delete the directory (or `make clean`) to rebuild.
#
# Builds run at low priority, one package at a time (the machine is shared):
#   KUBE_BUILD_P=1 (go build -p), nice -n 19. Go's module and build caches are reused.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
KUBE_VERSION="v1.37.2"
ETCD_VERSION="v3.7.3"
DEST="${KUBE_TOOLS_DIR:-$ROOT/.tools/kube/$KUBE_VERSION}"
BIN="$DEST/bin"
P="${KUBE_BUILD_P:-1}"
mkdir -p "$BIN"

# -trimpath and no VCS stamping make the output independent of the checkout path;
# -s -w drop symbol tables (smaller binaries, same behaviour).
# The -X flags stamp the version the way Kubernetes' hack/lib/version.sh does; without
# them the servers report v0.0.0-master and kubectl/the emulation-version checks see that.
LDFLAGS="-s -w"
ldflags_for() { # version
    local v="$1" major minor
    major="${v#v}"; major="${major%%.*}"
    minor="${v#v*.}"; minor="${minor%%.*}"
    local x
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        x+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        x+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "$LDFLAGS$x"
}

TIMES="$DEST/.times"
children_cpu_s() { # user+sys seconds of this shell's finished children, from `times >"$TIMES"`
    tail -1 "$TIMES" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] } printf "%d", s }'
}

build() { # name, module dir, package, version
    local name="$1" dir="$2" pkg="$3" version="$4"
    if [[ -x "$BIN/$name" ]]; then
        echo "$name: cached ($BIN/$name)"
        return
    fi
    echo "$name: building $pkg@$version (go build -p $P, nice 19) ..."
    local t0 t1 c0 c1
    t0=$(date +%s)
    times >"$TIMES"  # in this shell: $(times) would count a subshell's children
    c0=$(children_cpu_s)
    (cd "$dir" && nice -n 19 go build -p "$P" -trimpath -buildvcs=false \
        -ldflags "$(ldflags_for "$version")" -o "$BIN/$name.tmp" "$pkg")
    mv "$BIN/$name.tmp" "$BIN/$name"
    t1=$(date +%s)
    times >"$TIMES"
    c1=$(children_cpu_s)
    echo "$name: built in $((t1 - t0)) s (CPU $((c1 - c0)) s)"
    echo "$name $version $((t1 - t0))s cpu=$((c1 - c0))s -p $P $(date -u +%FT%TZ) load=$(cut -d' ' -f1-3 /proc/loadavg)" \
        >>"$DEST/build-times.txt"
}

build etcd "$ROOT/scripts/kube/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"
build kube-apiserver "$ROOT/scripts/kube" k8s.io/kubernetes/cmd/kube-apiserver "$KUBE_VERSION"
build kube-controller-manager "$ROOT/scripts/kube" k8s.io/kubernetes/cmd/kube-controller-manager "$KUBE_VERSION"
build kube-scheduler "$ROOT/scripts/kube" k8s.io/kubernetes/cmd/kube-scheduler "$KUBE_VERSION"

(cd "$BIN" && sha256sum etcd kube-apiserver kube-controller-manager kube-scheduler >"$DEST/SHA256SUMS")
echo "checksums: $DEST/SHA256SUMS"
cat "$DEST/SHA256SUMS"
