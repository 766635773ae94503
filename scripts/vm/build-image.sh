#!/usr/bin/env bash
# The VM tier's machine (tests/vm, docs/testing.md): a Debian 12 disk image like a user's
# server, built once per machine into a cache and booted by the tests as copy-on-write
# overlays (scripts/vm/boot.sh). What it holds:
#   - an MBR disk, one ext4 root file system (label "root", a fixed UUID: GRUB's menu entry
#     ids carry it, and the tests name entries by id), GRUB (i386-pc) in the MBR;
#   - systemd 252 as PID 1 on the unified cgroup v2 hierarchy (Debian 12's default);
#   - Debian's kernel 6.12 (NO_HZ_FULL, RCU_NOCB_CPU, cgroup v2 cpuset partitions), the
#     default entry, and its PREEMPT_RT build as a second entry (`grub-reboot` it);
#   - python3 with pip and make (`make install` + `make install-system` run inside, as a
#     user installs latencyd), ethtool, ssh for root with a key made here.
# Anything the tests need that a user's server would not have stays out.
#
# Cache: $LATENCYD_VM_CACHE, default /var/cache/latencyd-test/vm (root's, 0700):
#   id, id.pub                    the ssh key (made once; the image trusts it)
#   debian12-<stamp>.raw          the image, read-only; <stamp> hashes this file and the
#                                 key, so a changed recipe builds a new image
#   image                         symlink to the current image
# First run ~5-8 min (mmdebstrap downloads and unpacks ~250 packages; 2 cores), then
# nothing. Needs root, Debian's apt sources, mmdebstrap, sfdisk, grub-pc-bin, ~4 GB free.
#
# The host's loop driver may do no partition scan (max_part=0) and there may be no
# device-mapper: so the file system is made on a loop device with the partition's offset,
# and GRUB's core image is made with grub-mkimage and written with grub-bios-setup into the
# image file itself. The first grub.cfg is written here, with the ids and the next_entry
# logic grub-mkconfig's own has; the VM's update-grub writes the real one the first time
# something runs it inside (/etc/default/grub keeps the generic kernel the default there).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
RECIPE=$REPO/scripts/vm/build-image.sh
CACHE=${LATENCYD_VM_CACHE:-/var/cache/latencyd-test/vm}
SUITE=bookworm
KERNEL=linux-image-6.12-amd64
KERNEL_RT=linux-image-6.12-rt-amd64
ROOT_UUID=5e1ec7ed-0000-4000-8000-00000000051a
SIZE=4G
say() { echo "vm-image: $*"; }
die() {
    echo "vm-image: $*" >&2
    exit 1
}

((EUID == 0)) || die "run as root (mmdebstrap, loop devices, mount)"
for tool in mmdebstrap sfdisk losetup grub-mkimage qemu-img ssh-keygen; do
    command -v $tool >/dev/null || die "no $tool (make setup installs it)"
done
[[ -d /usr/lib/grub/i386-pc ]] || die "no /usr/lib/grub/i386-pc (apt-get install grub-pc-bin)"

mkdir -p "$CACHE"
[[ $(stat -c %u "$CACHE") == 0 ]] || die "$CACHE belongs to another user: not used"
chmod 700 "$(dirname "$CACHE")" "$CACHE"
[[ -s $CACHE/id ]] || ssh-keygen -q -t ed25519 -N '' -C latencyd-vm-tier -f "$CACHE/id"

stamp=$(cat "$RECIPE" "$CACHE/id.pub" | sha256sum | cut -c1-16)
image=$CACHE/debian12-$stamp.raw
if [[ -s $image ]]; then
    ln -sfn "$(basename "$image")" "$CACHE/image"
    say "ready: $image"
    exit 0
fi

say "building the Debian 12 image (first time for this recipe: ~5-8 min)"
started=$SECONDS
work=$(mktemp -d "$CACHE/build.XXXXXX")
mnt=$work/mnt
loop=
cleanup() {
    mountpoint -q "$mnt" && umount "$mnt"
    [[ -n $loop ]] && losetup -d "$loop"
    rm -rf "$work"
}
trap cleanup EXIT

packages=(
    systemd-sysv udev dbus kmod procps iproute2 util-linux e2fsprogs openssh-server
    python3 python3-pip python3-venv python3-dbus make ethtool
    "$KERNEL" "$KERNEL_RT" initramfs-tools grub-pc-bin grub2-common
)
grub_defaults='GRUB_DEFAULT=@DEFAULT@
GRUB_TIMEOUT=0
GRUB_TERMINAL=serial
GRUB_DISABLE_SUBMENU=y
GRUB_DISABLE_RECOVERY=true
GRUB_CMDLINE_LINUX_DEFAULT="console=ttyS0"
GRUB_CMDLINE_LINUX=""
'
# ssh answers as soon as the network is up: networkd on every NIC, no waiting for DNS.
nic='[Match]
Name=en* eth*
[Network]
DHCP=ipv4
'
mmdebstrap --quiet --variant=minbase --include="$(
    IFS=,
    echo "${packages[*]}"
)" \
    --customize-hook='echo vm >"$1/etc/hostname"' \
    --customize-hook='install -d -m 0700 "$1/root/.ssh" && install -m 0600 '"$CACHE"'/id.pub "$1/root/.ssh/authorized_keys"' \
    --customize-hook='printf "%s" "'"$nic"'" >"$1/etc/systemd/network/80-dhcp.network"' \
    --customize-hook='chroot "$1" systemctl enable systemd-networkd ssh serial-getty@ttyS0' \
    --customize-hook='printf "UUID='"$ROOT_UUID"' / ext4 defaults 0 1\n" >"$1/etc/fstab"' \
    --customize-hook='mkdir -p "$1/var/log/journal"' \
    "$SUITE" "$work/root.tar" http://deb.debian.org/debian \
    "deb http://deb.debian.org/debian-security $SUITE-security main" </dev/null

raw=$work/disk.raw
truncate -s "$SIZE" "$raw"
printf 'label: dos\nstart=2048, type=83, bootable\n' | sfdisk -q "$raw"
mkdir "$mnt"
loop=$(losetup -f --show -o $((2048 * 512)) "$raw")
mkfs.ext4 -q -L root -U "$ROOT_UUID" "$loop"
mount "$loop" "$mnt"
tar -C "$mnt" -xpf "$work/root.tar"
rm "$work/root.tar"

version() { # the installed kernel's release matching a glob, e.g. '*-rt-amd64'
    local found
    found=$(cd "$mnt/boot" && ls vmlinuz-$1 2>/dev/null | grep -v -- "${2:-^$}" | head -1)
    [[ -n $found ]] || die "no kernel $1 in the image"
    echo "${found#vmlinuz-}"
}
generic=$(version '*-amd64' -rt-)
rt=$(version '*-rt-amd64')
entry() { echo "gnulinux-$1-advanced-$ROOT_UUID"; } # grub-mkconfig's id without submenus
echo "${grub_defaults/@DEFAULT@/$(entry "$generic")}" >"$mnt/etc/default/grub"

grub=/usr/lib/grub/i386-pc
install -d "$mnt/boot/grub/i386-pc"
cp "$grub"/*.mod "$grub"/*.lst "$grub"/boot.img "$mnt/boot/grub/i386-pc/"
printf 'search --no-floppy --fs-uuid --set=root %s\nset prefix=($root)/boot/grub\n' \
    "$ROOT_UUID" >"$work/early.cfg"
grub-mkimage -O i386-pc -d "$grub" -o "$mnt/boot/grub/i386-pc/core.img" -c "$work/early.cfg" \
    -p /boot/grub biosdisk part_msdos ext2 search search_fs_uuid normal
echo "(hd0) $raw" >"$work/device.map"
"$grub"/grub-bios-setup -d "$mnt/boot/grub/i386-pc" -b boot.img -c core.img \
    -m "$work/device.map" --skip-fs-probe "$raw"
grub-editenv "$mnt/boot/grub/grubenv" create
{
    printf 'serial --unit=0 --speed=115200\nterminal_input serial\nterminal_output serial\n'
    printf 'load_env\nset default="%s"\n' "$(entry "$generic")"
    printf 'if [ "${next_entry}" ] ; then\n set default="${next_entry}"\n set next_entry=\n save_env next_entry\nfi\n'
    printf 'set timeout=0\n'
    for v in "$generic" "$rt"; do
        printf "menuentry 'Debian GNU/Linux, with Linux %s' --id %s {\n" "$v" "$(entry "$v")"
        printf ' linux /boot/vmlinuz-%s root=UUID=%s ro console=ttyS0\n' "$v" "$ROOT_UUID"
        printf ' initrd /boot/initrd.img-%s\n}\n' "$v"
    done
} >"$mnt/boot/grub/grub.cfg"
umount "$mnt"
losetup -d "$loop"
loop=

chmod 0400 "$raw"
mv "$raw" "$image"
ln -sfn "$(basename "$image")" "$CACHE/image"
find "$CACHE" -maxdepth 1 -name 'debian12-*.raw' ! -name "$(basename "$image")" -delete
say "built $image (kernels $generic and $rt) in $((SECONDS - started)) s"
