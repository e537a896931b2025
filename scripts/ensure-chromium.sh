#!/usr/bin/env bash
# Makes sure Debian's chromium is at /usr/bin/chromium, at the major playwright-core was released
# for: the console's browser tests drive it with playwright-core, pinned in package.json to the
# release whose bundled Chromium has the major Debian ships (test/unit/browser-version.test.ts fails
# with the two numbers when they drift apart). Playwright's own browser download is not used: it
# needs the internet, and Debian's package is what an operator's machine has. When chromium is
# missing or older, this installs it with apt-get (root only; a fresh CI machine runs as root).
# Debian keeps chromium current in bookworm-security only: an install from package lists that were
# not updated gets the (older) point release's build, so the lists are updated first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=/usr/bin/chromium
# the major playwright-core expects (its browsers.json), when it is installed
want=$(node -e 'const b=require(process.argv[1]).browsers.find((x)=>x.name==="chromium");console.log(b.browserVersion.split(".")[0])' \
  "$root/node_modules/playwright-core/browsers.json" 2>/dev/null || true)
major() { "$bin" --version 2>/dev/null | sed -n 's/^Chromium \([0-9]*\)\..*/\1/p'; }
have=""
[ -x "$bin" ] && have=$(major)
if [ -n "$have" ] && { [ -z "$want" ] || [ "$have" -ge "$want" ]; }; then exit 0; fi
what=${have:+"chromium $have is older than the $want playwright-core expects"}
what=${what:-"chromium is missing"}
if ! command -v apt-get >/dev/null; then
  echo "$what and apt-get is not available: install Chromium${want:+ $want} at $bin for the console's browser tests" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "$what: run 'sudo apt-get update && sudo apt-get install -y chromium' (installing needs root; the console's browser tests use it)" >&2
  exit 1
fi
echo "installing chromium (Debian) for the console's browser tests ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq chromium >/dev/null || apt-get install -y chromium >&2
have=$(major)
[ -n "$have" ] || { echo "chromium was installed but $bin --version fails" >&2; exit 1; }
if [ -n "$want" ] && [ "$have" != "$want" ]; then
  # the browser tests fail on this with the fix; the other tests need no browser
  echo "Debian's chromium is $have but playwright-core expects $want: pin playwright-core in package.json to the release bundling Chromium $have" >&2
fi
