#!/usr/bin/env bash
# Makes sure /usr/bin/python3 can `import grpc`: the gRPC tests and the README's example call
# grpc-proxy with Python's grpcio, a client callplane did not write. Debian ships it as
# python3-grpcio; when it is missing, this installs it with apt-get (root only; a fresh CI machine
# runs as root). A pyenv or virtualenv python is not used: the system one is what the package
# installs into.
set -euo pipefail
py=/usr/bin/python3
if [ -x "$py" ] && "$py" -c 'import grpc' 2>/dev/null; then exit 0; fi
if ! command -v apt-get >/dev/null; then
  echo "python3-grpcio is missing and apt-get is not available: install Python's grpcio for $py" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "python3-grpcio is missing: run 'sudo apt-get install -y python3-grpcio' (installing needs root)" >&2
  exit 1
fi
echo "installing python3-grpcio (Debian) for the gRPC tests ..." >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq python3-grpcio >/dev/null 2>&1 || {
  apt-get update -qq >&2
  apt-get install -y -qq python3-grpcio >&2
}
"$py" -c 'import grpc' || { echo "python3-grpcio was installed but $py cannot import grpc" >&2; exit 1; }
