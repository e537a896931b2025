#!/usr/bin/env bash
# Prints the path of a nats-server binary of version 2.10 or newer, installing one when none is found.
# Order: $CALLPLANE_NATS_SERVER, a nats-server on PATH, .tools/nats-server, then a download of
# Debian's nats-server package from a newer Debian suite (Debian 12 itself ships 2.9, which lacks
# features callplane relies on). The package is unpacked into .tools/; nothing is installed system-wide.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/.tools"
suite=${CALLPLANE_NATS_DEB_SUITE:-trixie}

version_ok() { # $1 = binary; true when it runs and reports >= 2.10
  local v
  v=$("$1" --version 2>/dev/null | sed -nE 's/.*v([0-9]+)\.([0-9]+).*/\1 \2/p') || return 1
  [ -n "$v" ] || return 1
  set -- $v
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }
}

for candidate in "${CALLPLANE_NATS_SERVER:-}" "$(command -v nats-server || true)" "$tools/nats-server"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && version_ok "$candidate"; then
    echo "$candidate"; exit 0
  fi
done

command -v apt-get >/dev/null && command -v dpkg >/dev/null || {
  echo "no nats-server >= 2.10 found and apt-get is not available to fetch one;" >&2
  echo "install nats-server 2.10+ and put it on PATH, or set CALLPLANE_NATS_SERVER=/path/to/nats-server" >&2
  exit 1
}
echo "fetching nats-server from Debian $suite into .tools/ ..." >&2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$tools"
# shellcheck source=debian-download.sh
. "$root/scripts/debian-download.sh"
debian_download "$suite" "$scratch" nats-server
dpkg-deb -x "$scratch"/nats-server_*.deb "$scratch/unpacked"
install -m 0755 "$scratch/unpacked/usr/sbin/nats-server" "$tools/nats-server"
version_ok "$tools/nats-server" || { echo "the downloaded nats-server is older than 2.10" >&2; exit 1; }
echo "$tools/nats-server"
