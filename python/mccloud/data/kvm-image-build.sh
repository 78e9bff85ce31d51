#!/bin/sh
# mccloud: builds a kvm image (a bootable disk of a Debian tree, and its
# kernel) for direct kernel boot by QEMU.
#
#   kvm-image-build.sh SRC_TREE_OR_EMPTY OUT_DIR
#
# SRC_TREE_OR_EMPTY  a root filesystem tree to start from (an lxc image's
#                    rootfs, Salt pre-installed in it), copied, never changed;
#                    empty: the tree is debootstrapped (MCCLOUD_RELEASE).
# OUT_DIR            the image directory to make (must not exist): it gets
#                    disk.qcow2 (ext4 on the whole disk, root=/dev/vda),
#                    vmlinuz, initrd.img and mccloud-image-version. It is built
#                    in OUT_DIR.tmp and renamed when complete.
#
# The recipe comes from the environment only (no value is ever part of a
# command line built as text):
#   MCCLOUD_VERSION      the image version written to mccloud-image-version (required)
#   MCCLOUD_RELEASE      Debian release to debootstrap (default bookworm)
#   MCCLOUD_PACKAGES     packages installed into the tree, one per line
#                        (default linux-image-cloud-amd64)
#   MCCLOUD_CLOUD_INIT   true: cloud-init is installed (NoCloud only)
#   MCCLOUD_DISK_SIZE    size of the disk (mkfs.ext4 units: 2G, 1500M);
#                        default: the tree's size * 1.3, at least 1G
#   MCCLOUD_SEED_SCRIPT  the mccloud-seed script installed into the image
#                        (default: mccloud-seed next to this script); its unit
#                        is mccloud-seed.service in the same directory
#   MCCLOUD_MIRROR       Debian mirror for debootstrap (default deb.debian.org)
#
# Progress goes to stderr; on success the last line on stdout is
# "mccloud-kvm-image: built <version>" and the exit status 0. Whatever it
# mounted is unmounted on every exit.
set -eu

PROG=mccloud-kvm-image
# Everything the tools print goes to stderr; stdout (fd 3) carries the result.
exec 3>&1 1>&2

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 1; }

[ "$#" -eq 2 ] || die "usage: kvm-image-build.sh SRC_TREE_OR_EMPTY OUT_DIR (got $# arguments)"
SRC=$1
OUT=$2
case "$OUT" in
    /*) ;;
    *) die "OUT_DIR must be an absolute path (got '$OUT')" ;;
esac
OUT=${OUT%/}
[ -n "$OUT" ] || die "OUT_DIR must not be /"
VERSION=${MCCLOUD_VERSION:-}
[ -n "$VERSION" ] || die "MCCLOUD_VERSION is empty: the image version is required"
case "$VERSION" in
    *[!A-Za-z0-9._+-]*) die "MCCLOUD_VERSION '$VERSION' has characters other than letters, digits and ._+-" ;;
esac
RELEASE=${MCCLOUD_RELEASE:-bookworm}
case "$RELEASE" in
    ''|*[!a-z0-9.-]*) die "MCCLOUD_RELEASE '$RELEASE' is not a Debian release name" ;;
esac
PACKAGES=${MCCLOUD_PACKAGES-linux-image-cloud-amd64}
case "${MCCLOUD_CLOUD_INIT:-false}" in
    true|True|TRUE|1|yes) CLOUD_INIT=true ;;
    false|False|FALSE|0|no|'') CLOUD_INIT=false ;;
    *) die "MCCLOUD_CLOUD_INIT must be true or false (got '${MCCLOUD_CLOUD_INIT}')" ;;
esac
DISK_SIZE=${MCCLOUD_DISK_SIZE:-}
case "$DISK_SIZE" in
    '') ;;
    *[!0-9KMGT]*|[!0-9]*) die "MCCLOUD_DISK_SIZE '$DISK_SIZE' is not a size like 2G or 1500M" ;;
esac
# The recipe's packages, one per line: names (with an optional =version or
# /release) only, never an option.
PKG_LIST=''
set -f
for pkg in $(printf '%s\n' "$PACKAGES" | tr -d ' \t\r'); do
    case "$pkg" in
        -*|*[!A-Za-z0-9.+:=~/_-]*) die "MCCLOUD_PACKAGES: '$pkg' is not a package name" ;;
    esac
    PKG_LIST="$PKG_LIST$pkg
"
done
set +f
HERE=$(cd "$(dirname "$0")" && pwd)
SEED_SCRIPT=${MCCLOUD_SEED_SCRIPT:-$HERE/mccloud-seed}
SEED_UNIT=$(dirname "$SEED_SCRIPT")/mccloud-seed.service
[ -f "$SEED_SCRIPT" ] || die "MCCLOUD_SEED_SCRIPT: no file $SEED_SCRIPT"
[ -f "$SEED_UNIT" ] || die "no unit $SEED_UNIT next to MCCLOUD_SEED_SCRIPT"
MIRROR=${MCCLOUD_MIRROR:-http://deb.debian.org/debian}
case "$MIRROR" in
    http://*|https://*|file:///*) ;;
    *) die "MCCLOUD_MIRROR '$MIRROR' is not an http(s):// or file:/// URL" ;;
esac
if [ -n "$SRC" ]; then
    [ -d "$SRC/etc" ] && [ -d "$SRC/usr" ] || die "source tree $SRC is not a root filesystem (no etc/ and usr/)"
fi
[ ! -e "$OUT" ] || die "$OUT exists: an image version is never rebuilt in place (remove it to rebuild)"
[ "$(id -u)" = 0 ] || die "must run as root (chroot, mounts, device nodes in the tree)"
for tool in mkfs.ext4 qemu-img chroot flock; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found (packages e2fsprogs, qemu-utils, coreutils, util-linux)"
done
[ -n "$SRC" ] || command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found and no source tree given"

WORK=$OUT.tmp
TREE=$WORK/tree

# Mount points under WORK, deepest first (from /proc/mounts: whatever a
# previous, killed run left there too).
mounted_under() {
    awk -v p="$1/" 'index($2 "/", p) == 1 { print $2 }' /proc/mounts | sort -r
}

unmount_all() {
    for m in $(mounted_under "$WORK"); do
        umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
}

cleanup() {
    rc=$?
    set +e
    unmount_all
    if [ "$rc" != 0 ]; then
        if [ -z "$(mounted_under "$WORK")" ]; then
            rm -rf --one-file-system "$WORK"
        else
            say "left $WORK: something is still mounted under it"
        fi
        say "failed (exit $rc)"
    fi
    exit "$rc"
}

mount_chroot() {
    mkdir -p "$TREE/proc" "$TREE/sys" "$TREE/dev"
    mount -t proc proc "$TREE/proc"
    mount -t sysfs sys "$TREE/sys"
    mount --bind /dev "$TREE/dev"
    if [ -d "$TREE/dev/pts" ]; then
        mount --bind /dev/pts "$TREE/dev/pts"
    fi
}

in_tree() {
    chroot "$TREE" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        DEBIAN_FRONTEND=noninteractive LC_ALL=C "$@"
}

# One build at a time in the image's directory (its versions side by side).
PARENT=$(dirname "$OUT")
mkdir -p "$PARENT"
exec 9<"$PARENT"
flock -n 9 || die "another build is running in $PARENT"
if [ -e "$WORK" ]; then
    # Left by a build that was killed: no build holds it (the lock).
    unmount_all
    [ -z "$(mounted_under "$WORK")" ] || die "$WORK has mounts left by an earlier build that do not unmount"
    say "removing the leftover $WORK"
    rm -rf --one-file-system "$WORK"
fi
mkdir -p "$WORK"
chmod 0755 "$WORK"
trap cleanup EXIT
trap 'exit 130' INT TERM HUP
start=$(date +%s)

if [ -n "$SRC" ]; then
    say "copying the tree $SRC"
    mkdir "$TREE"
    cp -a "$SRC/." "$TREE/"
else
    say "debootstrapping $RELEASE from $MIRROR"
    debootstrap --include=systemd-sysv,udev,ifupdown,openssh-server,iproute2,python3 \
        "$RELEASE" "$TREE" "$MIRROR" >&2 || die "debootstrap $RELEASE failed (see above)"
fi

# Services never start in the chroot (removed below, the tree's own kept).
POLICY=$TREE/usr/sbin/policy-rc.d
OWN_POLICY=
if [ ! -e "$POLICY" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$POLICY"
    chmod 755 "$POLICY"
    OWN_POLICY=1
fi
# The build's resolver, the tree's own restored after.
if [ -e "$TREE/etc/resolv.conf" ] || [ -L "$TREE/etc/resolv.conf" ]; then
    mv "$TREE/etc/resolv.conf" "$TREE/etc/resolv.conf.mccloud-build"
fi
cp -L /etc/resolv.conf "$TREE/etc/resolv.conf"

# A small initramfs: the virtio disk and ext4 are all it needs to mount root
# (files of their own: the package's conffiles stay untouched).
mkdir -p "$TREE/etc/initramfs-tools/conf.d" "$TREE/usr/share/initramfs-tools/modules.d"
printf '# mccloud kvm image: only the modules listed\nMODULES=list\n' \
    > "$TREE/etc/initramfs-tools/conf.d/mccloud"
printf '%s\n' virtio_pci virtio_blk virtio_net virtio_rng ext4 \
    > "$TREE/usr/share/initramfs-tools/modules.d/mccloud"

# The packages, as separate arguments (the recipe's, checked above).
set -f
old_ifs=$IFS
IFS='
'
# shellcheck disable=SC2086
set -- udev initramfs-tools $PKG_LIST
IFS=$old_ifs
set +f
if [ "$CLOUD_INIT" = true ]; then set -- "$@" cloud-init; fi

mount_chroot
say "installing into the tree: $*"
in_tree apt-get update -q >&2 || die "apt-get update in the tree failed (see above)"
in_tree apt-get install -y -q --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" >&2 \
    || die "apt-get install $* in the tree failed (see above)"

KVER=$(cd "$TREE/boot" && ls vmlinuz-* 2>/dev/null | sed 's/^vmlinuz-//' | sort -V | tail -n 1)
[ -n "$KVER" ] || die "no kernel in the tree's /boot: add linux-image-cloud-amd64 to the image's packages"
if [ ! -f "$TREE/boot/initrd.img-$KVER" ]; then
    say "making the initramfs of $KVER"
    in_tree update-initramfs -c -k "$KVER" >&2 || die "update-initramfs -c -k $KVER failed"
fi
in_tree apt-get clean >&2
unmount_all

say "making the tree a kvm guest"
rm -rf "$TREE/var/lib/apt/lists/"*
rm -f "$TREE/etc/resolv.conf"
if [ -e "$TREE/etc/resolv.conf.mccloud-build" ] || [ -L "$TREE/etc/resolv.conf.mccloud-build" ]; then
    mv "$TREE/etc/resolv.conf.mccloud-build" "$TREE/etc/resolv.conf"
fi
if [ -n "$OWN_POLICY" ]; then rm -f "$POLICY"; fi

SYSD=$TREE/etc/systemd/system
# lxc-debian's container tweaks: udev masked, container gettys masked, a
# getty-static of its own. A VM needs udev; its console is the serial port.
for unit in udev.service systemd-udevd.service getty-static.service; do
    if [ -L "$SYSD/$unit" ] || [ -f "$SYSD/$unit" ]; then rm -f "$SYSD/$unit"; fi
done
rm -f "$SYSD"/getty.target.wants/container-getty@*.service "$SYSD"/getty.target.wants/getty@tty*.service
# Useless in a VM with no screen and a fresh filesystem, and seconds each
# under software emulation.
mkdir -p "$SYSD"
for unit in getty-static.service e2scrub_reap.service; do
    ln -sf /dev/null "$SYSD/$unit"
done

printf '# mccloud kvm image: the root filesystem is the whole virtio disk\n/dev/vda / ext4 errors=remount-ro 0 1\n' \
    > "$TREE/etc/fstab"
mkdir -p "$TREE/etc/network/interfaces.d"
cat > "$TREE/etc/network/interfaces" <<'EOF'
# mccloud kvm image: the loopback only; mccloud-seed writes
# /etc/network/interfaces.d/mccloud (static addresses) from the seed at boot.
auto lo
iface lo inet loopback

source /etc/network/interfaces.d/*
EOF
# One identity per guest: a machine id made at first boot, host keys made
# by mccloud-seed (every guest of this image shared them otherwise).
: > "$TREE/etc/machine-id"
if [ -f "$TREE/var/lib/dbus/machine-id" ] && [ ! -L "$TREE/var/lib/dbus/machine-id" ]; then
    rm -f "$TREE/var/lib/dbus/machine-id"
fi
rm -f "$TREE"/etc/ssh/ssh_host_*

install -d -m 0755 "$TREE/usr/local/sbin" "$SYSD/sysinit.target.wants"
install -m 0755 "$SEED_SCRIPT" "$TREE/usr/local/sbin/mccloud-seed"
install -m 0644 "$SEED_UNIT" "$SYSD/mccloud-seed.service"
ln -sf ../mccloud-seed.service "$SYSD/sysinit.target.wants/mccloud-seed.service"
if [ "$CLOUD_INIT" = true ]; then
    mkdir -p "$TREE/etc/cloud/cloud.cfg.d"
    printf '# mccloud: the seed is a NoCloud cidata volume\ndatasource_list: [NoCloud, None]\n' \
        > "$TREE/etc/cloud/cloud.cfg.d/90-mccloud.cfg"
fi
printf '%s\n' "$VERSION" > "$TREE/etc/mccloud-kvm-image-version"

cp -L "$TREE/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
cp -L "$TREE/boot/initrd.img-$KVER" "$WORK/initrd.img"

[ -z "$(mounted_under "$WORK")" ] || die "still mounted under $TREE: the disk would hold the host's files"
if [ -z "$DISK_SIZE" ]; then
    used=$(du -smx "$TREE" | cut -f1)
    mib=$((used * 13 / 10 + 64))
    [ "$mib" -ge 1024 ] || mib=1024
    DISK_SIZE=${mib}M
fi
say "making the disk ($DISK_SIZE, kernel $KVER)"
mkfs.ext4 -q -F -L mccloud-root -d "$TREE" "$WORK/disk.raw" "$DISK_SIZE" >&2 \
    || die "mkfs.ext4 -d of the tree failed (a MCCLOUD_DISK_SIZE of $DISK_SIZE too small?)"
qemu-img convert -f raw -O qcow2 "$WORK/disk.raw" "$WORK/disk.qcow2" >&2 || die "qemu-img convert failed"
rm -f "$WORK/disk.raw"
rm -rf --one-file-system "$TREE"
printf '%s\n' "$VERSION" > "$WORK/mccloud-image-version"
chmod 0644 "$WORK/disk.qcow2" "$WORK/vmlinuz" "$WORK/initrd.img" "$WORK/mccloud-image-version"
mv "$WORK" "$OUT"
say "done in $(( $(date +%s) - start )) s: $OUT"
printf '%s: built %s\n' "$PROG" "$VERSION" >&3
