#!/usr/bin/env bash
# Fetch Debian's prometheus and promtool into .tools/bin when prometheus is not on PATH
# (no root needed: apt-get download with private package lists, then dpkg -x). The
# tests that need a real Prometheus look on PATH first, then in .tools/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.tools/bin
command -v prometheus >/dev/null 2>&1 && exit 0
[ -x "$dest/prometheus" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
apt=(-qq -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o Debug::NoLocking=1
     -o APT::Sandbox::User="$(id -un)")
apt-get "${apt[@]}" update >/dev/null
(cd "$work" && apt-get "${apt[@]}" download prometheus >/dev/null)
dpkg -x "$work"/prometheus_*.deb "$work/root"
mkdir -p "$dest"
install -m 0755 "$work/root/usr/bin/prometheus" "$work/root/usr/bin/promtool" "$dest/"
"$dest/prometheus" --version | head -1
