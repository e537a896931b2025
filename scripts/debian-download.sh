# Sourced by the scripts that fetch a tool from Debian's archive when it is not installed
# (ensure-nats-server.sh, ensure-haproxy.sh): downloads packages of one Debian suite into a folder,
# with apt's lists and cache in a scratch folder of their own, so nothing system-wide is read,
# locked or changed and no root is needed.
# Usage: debian_download <suite> <folder> <package>...   (the mirror: $CALLPLANE_DEB_MIRROR)
debian_download() {
  local suite=$1 into=$2
  shift 2
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
  return "$ok"
}
