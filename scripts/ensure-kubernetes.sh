#!/usr/bin/env bash
# Prints two lines: the folder holding kube-apiserver and kube-controller-manager (Kubernetes
# 1.20.2), then the path of etcd. The tests of the kubernetes compute backend run them on loopback.
#
# Order for the Kubernetes binaries: $CALLPLANE_KUBE_BIN (a folder), a folder on PATH holding both,
# then the cache (${XDG_CACHE_HOME:-~/.cache}/callplane/kubernetes-1.20.2/bin, outside the clone, so
# every clone of the machine shares one build); else they are BUILT into the cache from Debian's own
# `kubernetes` source package (1.20.2, every Go dependency vendored) with Debian's Go 1.19, once per
# machine: about 11 minutes on 2 cores, logged to the cache folder. etcd: $CALLPLANE_ETCD, then
# Debian's etcd-server package (installed with apt-get when missing).
#
# One patch to the vendored tree: github.com/modern-go/reflect2 1.0.1 panics on the first request
# that decodes a map under Go 1.18 and later; Debian's golang-github-modern-go-reflect2-dev (1.0.2)
# replaces it. Kubernetes 1.20 is long out of support: it is here to test API semantics (admission,
# RBAC, TokenRequest, the garbage collector), not to run a cluster.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=1.20.2
cache=${XDG_CACHE_HOME:-$HOME/.cache}/callplane/kubernetes-$version
components=(kube-apiserver kube-controller-manager)

has_all() { for c in "${components[@]}"; do [ -x "$1/$c" ] || return 1; done; }

find_bin() {
  if [ -n "${CALLPLANE_KUBE_BIN:-}" ]; then
    has_all "$CALLPLANE_KUBE_BIN" || {
      echo "CALLPLANE_KUBE_BIN=$CALLPLANE_KUBE_BIN does not hold ${components[*]}" >&2
      exit 1
    }
    echo "$CALLPLANE_KUBE_BIN"
    return
  fi
  local p
  if p=$(command -v kube-apiserver) && has_all "$(dirname "$p")" &&
    "$p" --version 2>/dev/null | grep -q "v$version"; then
    dirname "$p"
    return
  fi
  if has_all "$cache/bin"; then echo "$cache/bin"; return; fi
  return 1
}

need_root() {
  command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] || {
    echo "$1 is missing and this is not root on a Debian machine: build it elsewhere and set $2" >&2
    exit 1
  }
}

build() {
  need_root "kube-apiserver $version" CALLPLANE_KUBE_BIN
  mkdir -p "$cache"
  local log="$cache/build.log"
  echo "building kube-apiserver and kube-controller-manager $version from Debian's source (once per machine, about 11 minutes on 2 cores; log: $log) ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  {
    # rsync: the build's code generators are copied into _output/bin with it (without it they are
    # left as files that cannot run, and the build fails on "Permission denied")
    apt-get install -y -qq golang-1.19-go golang-github-modern-go-reflect2-dev rsync ||
      { apt-get update -qq && apt-get install -y -qq golang-1.19-go golang-github-modern-go-reflect2-dev rsync; }
  } >>"$log" 2>&1
  local scratch
  scratch=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$scratch'" EXIT
  mkdir -p "$scratch/state/lists/partial" "$scratch/cache/archives/partial" "$scratch/src"
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local mirror=${CALLPLANE_DEB_MIRROR:-http://deb.debian.org/debian}
  printf 'deb-src [signed-by=%s] %s bookworm main\ndeb-src [signed-by=%s] http://deb.debian.org/debian-security bookworm-security main\n' \
    "$keyring" "$mirror" "$keyring" >"$scratch/sources.list"
  local apt_opts=(
    -o "Dir::Etc::SourceList=$scratch/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State=$scratch/state" -o "Dir::Cache=$scratch/cache" -o "Debug::NoLocking=true"
  )
  apt-get "${apt_opts[@]}" -qq update >>"$log" 2>&1
  # apt checks the files against the signed Sources index; only the upstream tarball is used (Debian's
  # own patches change kubectl's output, not the servers)
  (cd "$scratch/src" && apt-get "${apt_opts[@]}" -qq source --download-only kubernetes) >>"$log" 2>&1
  tar -xzf "$scratch"/src/kubernetes_*.orig.tar.gz -C "$scratch/src"
  local tree
  tree=$(find "$scratch/src" -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)
  [ -n "$tree" ] && [ -d "$tree/cmd/kube-apiserver" ] || {
    echo "Debian's kubernetes source has an unexpected layout (no cmd/kube-apiserver)" >&2
    exit 1
  }
  rm -rf "$tree/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$tree/vendor/github.com/modern-go/reflect2"
  rm -f "$tree/vendor/github.com/modern-go/reflect2/go.mod"
  # 1.20 builds in GOPATH mode from k8s.io/kubernetes, as Debian's rules build kubectl
  mkdir -p "$tree/.go/src/k8s.io"
  ln -sfn ../../.. "$tree/.go/src/k8s.io/kubernetes"
  (
    cd "$tree"
    export GOPATH="$tree/.go" PATH="/usr/lib/go-1.19/bin:$PATH" CGO_ENABLED=0 GOPROXY=off \
      GOFLAGS= GOCACHE="$scratch/gocache" HOME="$scratch/home"
    make WHAT="$(printf 'cmd/%s ' "${components[@]}")"
  ) >>"$log" 2>&1 || { echo "the build failed; see $log" >&2; exit 1; }
  mkdir -p "$cache/bin"
  for c in "${components[@]}"; do
    install -m 0755 "$tree/_output/local/bin/linux/amd64/$c" "$cache/bin/$c.new"
    mv "$cache/bin/$c.new" "$cache/bin/$c"
  done
  echo "built into $cache/bin" >&2
}

if ! bin=$(find_bin); then
  # one build per machine even when two runs start at once: the second waits, then finds it
  mkdir -p "$cache"
  exec 9>"$cache/.lock"
  flock 9
  bin=$(find_bin) || { build; bin=$cache/bin; }
fi

etcd=${CALLPLANE_ETCD:-}
if [ -z "$etcd" ]; then
  etcd=$(bash "$root/scripts/ensure-debian-tool.sh" etcd etcd-server)
fi
[ -x "$etcd" ] || { echo "etcd ($etcd) is not executable" >&2; exit 1; }
echo "$bin"
echo "$etcd"
