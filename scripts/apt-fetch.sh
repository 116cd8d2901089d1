#!/usr/bin/env bash
# apt-fetch.sh — unpack Debian packages of another suite (trixie, sid) into a prefix the project owns,
# without touching the host's packages: a private sources list and lists dir built from the archive URI
# this machine's apt already uses, `apt-get download` by name and exact version, then `dpkg -x`.
# apt checks the suite's Release signature (Debian's archive keyring) and each .deb's hash as usual.
#
#   bash scripts/apt-fetch.sh SUITE DEST PKG=VERSION...
#     e.g. bash scripts/apt-fetch.sh trixie .tools/containerd-1.7 containerd=1.7.24~ds1-6+deb13u1
#   Prints DEST (absolute) on stdout when DEST holds every PKG=VERSION (a stamp file per package);
#   progress and errors go to stderr. Idempotent: an unpacked package is not fetched again.
#
# Knobs: KOORDLET_TOOLS (default <repo>/.tools): where the private apt state (lists, cache) lives.
#        APT_FETCH_URI: the archive URI (default: the first `URIs:` / `deb` line of the host's sources
#        that serves Debian's main archive).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "apt-fetch: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }
[ $# -ge 3 ] || die "usage: apt-fetch.sh SUITE DEST PKG=VERSION..."
suite=$1 dest=$2; shift 2
case $suite in (*[!a-z0-9-]*|"") die "bad suite name: $suite";; esac
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)

missing() {
  todo=()
  local spec
  for spec in "$@"; do
    [[ $spec == *=* ]] || die "give an exact version: $spec (PKG=VERSION)"
    [ -f "$dest/.fetched-${spec//[:\/]/_}" ] || todo+=("$spec")
  done
  [ ${#todo[@]} -gt 0 ]
}
missing "$@" || { echo "$dest"; exit 0; }  # (a v2 guest, whose checkout is read-only, always ends here)
# Test sessions run at once (the parallel host stage, its serial session, the v2 stage) and may want the same
# package: one fetch at a time per suite (its apt lists are shared), each looking again once it has the lock.
tools_dir=${KOORDLET_TOOLS:-$here/.tools}
mkdir -p "$tools_dir/apt"
exec {lock_fd}>"$tools_dir/apt/$suite.lock"
flock "$lock_fd"
missing "$@" || { echo "$dest"; exit 0; }

# The archive URI of this machine's own apt sources: deb822 (`URIs:`) or one-line (`deb URI suite`).
uri=${APT_FETCH_URI:-}
if [ -z "$uri" ]; then
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    uri=$(awk '/^URIs:/ && $2 !~ /security/ {print $2; exit}' "$f")
    [ -n "$uri" ] && break
  done
fi
if [ -z "$uri" ]; then
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f")
    [ -n "$uri" ] && break
  done
fi
[ -n "$uri" ] || die "no Debian archive URI in /etc/apt/sources.list{,.d/} (set APT_FETCH_URI)"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -r "$keyring" ] || die "missing $keyring (apt-get install debian-archive-keyring)"

state=$tools_dir/apt/$suite
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs"
echo "deb [signed-by=$keyring] $uri $suite main" > "$state/sources.list"
opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache" -o Debug::NoLocking=1
      -o APT::Get::List-Cleanup=0 -o Acquire::Retries=3)
# The lists are refreshed when older than a day or when a wanted version is not in them.
fresh=$(find "$state/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -1)
have_all() { local s; for s in "${todo[@]}"; do
  apt-cache "${opts[@]}" show "$s" >/dev/null 2>&1 || return 1; done; }
if [ -z "$fresh" ] || ! have_all; then
  log "apt-get update ($suite, private lists in $state)"
  apt-get "${opts[@]}" update -q >"$state/update.log" 2>&1 || { tail -5 "$state/update.log" >&2; die "apt-get update for $suite failed"; }
fi
for spec in "${todo[@]}"; do
  apt-cache "${opts[@]}" show "$spec" >/dev/null 2>&1 ||
    die "$spec is not in $suite any more (apt-cache policy ${spec%%=*} with the lists in $state shows what is)"
done
log "download ${todo[*]}"
(cd "$state/debs" && apt-get "${opts[@]}" download -q "${todo[@]}" >"$state/download.log" 2>&1) ||
  { tail -5 "$state/download.log" >&2; die "apt-get download failed"; }
for spec in "${todo[@]}"; do
  name=${spec%%=*} version=${spec#*=}
  deb=$(ls "$state/debs/${name}_${version//:/%3a}_"*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || deb=$(ls "$state/debs/${name}_"*"${version#*:}"*.deb 2>/dev/null | head -1)
  [ -n "$deb" ] || die "downloaded $spec but found no .deb for it in $state/debs"
  dpkg-deb -x "$deb" "$dest"
  : > "$dest/.fetched-${spec//[:\/]/_}"
  log "unpacked $(basename "$deb") into $dest"
done
echo "$dest"
