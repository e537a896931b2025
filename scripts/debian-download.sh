# Sourced by the scripts that fetch a tool from Debian's archive when it is not installed
# (ensure-nats-server.sh, ensure-haproxy.sh): downloads packages of one Debian suite into a folder,
# with apt's lists and cache in a scratch folder of their own, so nothing system-wide is read,
# locked or changed and no root is needed. The packages are kept in a cache of the user's
# (~/.cache/callplane/debs/<suite>/, as the Kubernetes build is), so a fresh clone on the same
# machine takes them from there instead of fetching the suite's package lists again.
# Usage: debian_download <suite> <folder> <package>...   (the mirror: $CALLPLANE_DEB_MIRROR)
debian_download() {
  local suite=$1 into=$2
  shift 2
  local cache="${XDG_CACHE_HOME:-$HOME/.cache}/callplane/debs/$suite"
  local pkg missing=0
  for pkg in "$@"; do compgen -G "$cache/${pkg}_*.deb" >/dev/null || missing=1; done
  if [ "$missing" = 0 ]; then
    mkdir -p "$into"
    for pkg in "$@"; do cp "$cache/${pkg}"_*.deb "$into/"; done
    return 0
  fi
  local mirror=${CALLPLANE_DEB_MIRROR:-http://deb.debian.org/debian}
  local apt
  apt=$(mktemp -d)
  mkdir -p "$apt/state/lists/partial" "$apt/cache/archives/partial" "$into"
  printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s %s main\n' "$mirror" "$suite" >"$apt/sources.list"
  local opts=(
    -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State=$apt/state" -o "Dir::Cache=$apt/cache" -o "Debug::NoLocking=true"
    -o "APT::Sandbox::User=$(id -un)"
  )
  local ok=0
  apt-get "${opts[@]}" -qq update >&2 && (cd "$into" && apt-get "${opts[@]}" -qq download "$@" >&2) || ok=$?
  rm -rf "$apt"
  if [ "$ok" = 0 ] && mkdir -p "$cache" 2>/dev/null; then
    # one version of each package in the cache; one that cannot be written is no failure (the
    # packages are in $into)
    local deb name
    for deb in "$into"/*.deb; do
      name=${deb##*/}
      rm -f "$cache/${name%%_*}"_*.deb
      cp "$deb" "$cache/" 2>/dev/null || true
    done
  fi
  return "$ok"
}
