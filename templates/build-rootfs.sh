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
# A killed debootstrap can leave /proc, /sys or /dev mounted inside the
# target: unmount them, and never let rm cross into another file system.
cleanup() {
  findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$tmp"
}
trap cleanup EXIT
mkdir -p "$(dirname "$out")"
echo "rootfs: debootstrap bookworm ($pkgs)"
debootstrap --variant=minbase --include="$pkgs" bookworm "$tmp" "$mirror" |
  awk '/^I: (Retrieving|Validating|Unpacking|Configuring) / {n++; if (n % 40 == 0) {print "rootfs:   " $0; fflush()}} /^[EW]: / {print; fflush()}'
echo "rootfs: adding user 'user'"
chroot "$tmp" /usr/sbin/useradd --create-home --uid 1000 --user-group --shell /bin/bash user
# As in E2B's sandboxes, `user` may sudo without a password: the sandbox,
# not the account, is the boundary (the API runs commands as root anyway).
if [ -d "$tmp/etc/sudoers.d" ]; then
  echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > "$tmp/etc/sudoers.d/user"
  chmod 0440 "$tmp/etc/sudoers.d/user"
fi
chroot "$tmp" /usr/bin/apt-get clean
rm -rf "$tmp"/var/lib/apt/lists/* "$tmp"/var/cache/apt/* "$tmp"/tmp/* "$tmp"/var/log/*
# A login shell (every command runs as `bash -l -c`) would fork `id -u` in
# /etc/profile; bash knows $EUID already, and a fork costs milliseconds in gVisor.
sed -i 's/"$(id -u)"/"${EUID:-$(id -u)}"/' "$tmp/etc/profile"
# root's .profile forks `mesg n` on every login shell, which has no
# terminal to protect here.
sed -i '/^mesg n/d' "$tmp/root/.profile"
# Names resolve locally (socket.getfqdn() and friends must not wait on DNS).
# DNS goes to the sandbox's gateway; where no resolver answers there,
# lookups fail at once (port unreachable) instead of timing out.
printf '127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n' > "$tmp/etc/hosts"
echo sandbox > "$tmp/etc/hostname"
# glibc maps one locale-archive far faster than it opens the C.UTF-8
# directory's dozen files, which every process start does.
chroot "$tmp" /usr/bin/localedef --add-to-archive /usr/lib/locale/C.utf8
echo "nameserver 10.88.0.1" > "$tmp/etc/resolv.conf"
# Every command runs as `bash -l -c ...`. A statically linked bash (the same
# version, from bash-static) starts about twice as fast under gVisor: no
# dynamic loader and no shared libraries to map. apt can put the dynamic
# one back if a user reinstalls bash.
cp "$tmp/bin/bash-static" "$tmp/usr/bin/bash"
# matplotlib picks the non-interactive backend without probing for a display.
echo "backend: Agg" > "$tmp/etc/matplotlibrc"
mkdir -p "$tmp/opt/cellfork"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
echo "rootfs: done ($(du -sm "$out" | cut -f1) MB)"
