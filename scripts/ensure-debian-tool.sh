#!/usr/bin/env bash
# Prints the path of a command from one of Debian's packages, installing the package with apt-get
# when the command is missing (root only; a fresh CI machine runs as root). The fault suite and the
# benchmarks use tools callplane does not ship (HAProxy as the load balancer in front of replicas).
# Usage: ensure-debian-tool.sh <command> <package>
set -euo pipefail
cmd=$1
pkg=$2
if p=$(command -v "$cmd"); then echo "$p"; exit 0; fi
for d in /usr/sbin /usr/bin /sbin; do [ -x "$d/$cmd" ] && { echo "$d/$cmd"; exit 0; }; done
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "$cmd is missing: install Debian's $pkg package (apt-get install -y $pkg; needs root)" >&2
  exit 1
fi
echo "installing Debian's $pkg (for $cmd) ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq "$pkg" >/dev/null 2>&1 || { apt-get update -qq >&2 && apt-get install -y -qq "$pkg" >&2; }
for d in /usr/sbin /usr/bin /sbin; do [ -x "$d/$cmd" ] && { echo "$d/$cmd"; exit 0; }; done
command -v "$cmd" || { echo "$pkg was installed but $cmd is not found" >&2; exit 1; }
