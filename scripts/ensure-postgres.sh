#!/usr/bin/env bash
# Prints the folder holding PostgreSQL's server programs (initdb, postgres, pg_ctl), installing
# Debian's postgresql package when none is found. Order: $CALLPLANE_PG_BIN, then the newest
# /usr/lib/postgresql/<version>/bin, then `apt-get install postgresql` (needs root). Used by the
# tests that run the API on PostgreSQL; callplane itself only needs a server to connect to.
set -euo pipefail
has_server() { [ -x "$1/initdb" ] && [ -x "$1/postgres" ]; }
if [ -n "${CALLPLANE_PG_BIN:-}" ] && has_server "$CALLPLANE_PG_BIN"; then echo "$CALLPLANE_PG_BIN"; exit 0; fi
newest() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }
dir=$(newest)
if [ -n "$dir" ] && has_server "$dir"; then echo "$dir"; exit 0; fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "no PostgreSQL server found: install Debian's postgresql package, or set CALLPLANE_PG_BIN to the folder holding initdb and postgres" >&2
  exit 1
fi
echo "installing Debian's postgresql package (for the PostgreSQL tests) ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq postgresql >&2 || { apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2; }
dir=$(newest)
has_server "$dir" || { echo "postgresql installed, but no server programs under /usr/lib/postgresql" >&2; exit 1; }
echo "$dir"
