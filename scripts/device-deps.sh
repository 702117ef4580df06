#!/usr/bin/env bash
# Fetches, on a machine with Debian's apt, what the GPU machine lacks (it reaches no registry):
# SQLite's header and library, CLI11, Chart.js and GoogleTest's sources, unpacked into .deps/.
# setup.sh and CMake look there first. Run it once here; carry .deps/ to the GPU machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPS="$ROOT/.deps"
packages=(libsqlite3-dev libsqlite3-0 libcli11-dev libjs-chart.js googletest)
work="$(mktemp -d)"
chmod 755 "$work"
trap 'rm -rf "$work"' EXIT
[ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null
(cd "$work" && apt-get download "${packages[@]}" >/dev/null)
rm -rf "$DEPS"
mkdir -p "$DEPS"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$DEPS"; done
# Only what the build reads: keep the folder small enough to travel.
rm -rf "$DEPS/usr/share/doc" "$DEPS/usr/share/man" "$DEPS/usr/bin" "$DEPS"/usr/lib/*/libsqlite3.a
echo "fusekit: unpacked ${packages[*]} into $DEPS ($(du -sh "$DEPS" | cut -f1))"
