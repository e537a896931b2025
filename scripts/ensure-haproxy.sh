#!/usr/bin/env bash
# Prints the path of an HAProxy 2.6+ binary (the worker callback proxy), fetching one when none is found.
# Order: $CALLPLANE_HAPROXY, haproxy on PATH or in /usr/sbin, .tools/haproxy/haproxy, then a download
# of Debian's haproxy package and the libraries this machine lacks for it (lua, opentracing) from
# the Debian suite (bookworm by default: HAProxy 2.6), unpacked into .tools/haproxy/ and run through a
# small wrapper that points the loader at them. Nothing is installed system-wide; no root is needed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dest="$root/.tools/haproxy"
suite=${CALLPLANE_HAPROXY_DEB_SUITE:-bookworm}

version_ok() { # $1 = binary; true when it runs and reports >= 2.6 with OpenSSL and the Prometheus exporter
  local out v
  out=$("$1" -vv 2>/dev/null) || return 1
  v=$(sed -nE '1s/^HA-?Proxy version ([0-9]+)\.([0-9]+).*/\1 \2/p' <<<"$out")
  [ -n "$v" ] || return 1
  grep -q 'USE_OPENSSL=1' <<<"$out" && grep -q 'PROMEX' <<<"$out" || return 1
  set -- $v
  [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 6 ]; }
}

for candidate in "${CALLPLANE_HAPROXY:-}" "$(command -v haproxy || true)" /usr/sbin/haproxy "$dest/haproxy"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && version_ok "$candidate"; then
    echo "$candidate"; exit 0
  fi
done

command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
  echo "no HAProxy >= 2.6 found and apt-get is not available to fetch one;" >&2
  echo "install Debian's haproxy package, or set CALLPLANE_HAPROXY=/path/to/haproxy" >&2
  exit 1
}
echo "fetching haproxy from Debian $suite into .tools/haproxy/ ..." >&2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# shellcheck source=debian-download.sh
. "$root/scripts/debian-download.sh"
# the libraries haproxy links that a minimal Debian 12 lacks; the rest (libc, libssl3, pcre2,
# libsystemd, libcrypt) are part of every Debian 12 system
debian_download "$suite" "$scratch" haproxy liblua5.3-0 libopentracing-c-wrapper0 libopentracing1
rm -rf "$dest.new" && mkdir -p "$dest.new"
for deb in "$scratch"/*.deb; do dpkg-deb -x "$deb" "$dest.new/root"; done
libdir=$(dirname "$(find "$dest.new/root" -name 'liblua5.3.so.0*' | head -1)")
cat >"$dest.new/haproxy" <<WRAP
#!/bin/sh
# Debian's haproxy with the libraries fetched beside it (scripts/ensure-haproxy.sh)
LD_LIBRARY_PATH="$dest/root/${libdir#"$dest.new/root/"}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$dest/root/usr/sbin/haproxy" "\$@"
WRAP
chmod 0755 "$dest.new/haproxy"
rm -rf "$dest" && mv "$dest.new" "$dest"
version_ok "$dest/haproxy" || { echo "the fetched haproxy does not run here: $("$dest/haproxy" -v 2>&1 | head -3)" >&2; exit 1; }
echo "$dest/haproxy"
