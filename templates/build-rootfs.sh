#!/usr/bin/env bash
# build-rootfs.sh PACKAGES_FILE OUT_DIR [PIP_FILE]
# Builds a Debian bookworm rootfs with the listed packages, the Python
# packages of PIP_FILE (a pip requirements file with hashes) and a user
# `user` (uid 1000, home /home/user) into OUT_DIR, atomically: OUT_DIR
# appears only when the build succeeded.
set -euo pipefail
pkgs_file=$1 out=$2 pip_file=${3:-}
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
if [ -n "$pip_file" ] && grep -q '^[A-Za-z0-9]' "$pip_file"; then
  echo "rootfs: pip install $(grep -o '^[A-Za-z0-9._-]*==[^ ]*' "$pip_file" | xargs)"
  # pip in the rootfs reaches PyPI as the host does: through the host's
  # resolver, trusting the host's CA bundle (which may hold a proxy's CA).
  # The rootfs's own resolv.conf is written below.
  cp /etc/resolv.conf "$tmp/etc/resolv.conf"
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$tmp/tmp/host-ca.crt"
  cp "$pip_file" "$tmp/tmp/pip-requirements.txt"
  chroot "$tmp" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
    ${HTTPS_PROXY:+HTTPS_PROXY=$HTTPS_PROXY} ${https_proxy:+https_proxy=$https_proxy} \
    /usr/bin/python3 -m pip install --quiet --no-cache-dir --disable-pip-version-check --root-user-action=ignore \
    --break-system-packages --require-hashes --no-deps --only-binary=:all: \
    --cert /tmp/host-ca.crt -r /tmp/pip-requirements.txt
  rm -f "$tmp/tmp/host-ca.crt" "$tmp/tmp/pip-requirements.txt"
fi
# `pip install` works in sandboxes as in E2B's (installing into /usr/local
# as root, into ~/.local for user) instead of refusing Debian's Python
# (PEP 668).
printf '[global]\nbreak-system-packages = true\n' > "$tmp/etc/pip.conf"
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
