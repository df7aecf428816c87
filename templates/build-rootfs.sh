#!/usr/bin/env bash
# build-rootfs.sh PACKAGES_FILE OUT_DIR
# Builds a Debian bookworm rootfs with the listed packages and a user `user`
# (uid 1000, home /home/user) into OUT_DIR, atomically: OUT_DIR appears only
# when the build succeeded.
set -euo pipefail
pkgs_file=$1 out=$2
mirror=${CELLFORK_DEBIAN_MIRROR:-http://deb.debian.org/debian}
pkgs=$(grep -v '^\s*#' "$pkgs_file" | xargs | tr ' ' ,)
tmp="$out.tmp.$$"
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$(dirname "$out")"
echo "rootfs: debootstrap bookworm ($pkgs)"
debootstrap --variant=minbase --include="$pkgs" bookworm "$tmp" "$mirror" |
  awk '/^I: (Retrieving|Validating|Unpacking|Configuring) / {n++; if (n % 40 == 0) {print "rootfs:   " $0; fflush()}} /^[EW]: / {print; fflush()}'
echo "rootfs: adding user 'user'"
chroot "$tmp" /usr/sbin/useradd --create-home --uid 1000 --user-group --shell /bin/bash user
chroot "$tmp" /usr/bin/apt-get clean
rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/* "$tmp"/tmp/* "$tmp"/var/log/*
# matplotlib picks the non-interactive backend without probing for a display.
echo "backend: Agg" > "$tmp/etc/matplotlibrc"
mkdir -p "$tmp/opt/cellfork"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "rootfs: done ($(du -sm "$out" | cut -f1) MB)"
