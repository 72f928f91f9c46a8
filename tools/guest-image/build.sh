#!/usr/bin/env bash
# Build the guest image for instances and sandboxes (docs/instances.md): a
# Debian bookworm minbase root file system with OpenSSH and cloud-init
# (NoCloud only), as a partition-less ext4 in qcow2, plus the kernel and an
# initramfs to boot it with -kernel/-initrd/-append root=/dev/vda (no
# bootloader, which keeps TCG boots short).
#
#   tools/guest-image/build.sh [OUT_DIR]     (default: bin/guest-image)
#
# Writes OUT_DIR/rootfs.qcow2, vmlinuz, initrd.img, cmdline, SHA256SUMS (of
# the three boot files: bcd checks an instance's image digest against it) and
# INPUTS (the hash of this script and its inputs). OUT_DIR is one image of a
# bcd guest image directory (--guest-images DIR: DIR/NAME is an image). A run whose INPUTS match the output's
# does nothing, so `make guest-image` is cheap once built. Needs root
# (debootstrap, chroot, ownership kept by mkfs.ext4 -d) and the network to
# reach MIRROR. Debian packages: debootstrap, qemu-utils, e2fsprogs.
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/bin/guest-image}
mirror=${MIRROR:-http://deb.debian.org/debian}
suite=bookworm
size=${GUEST_ROOT_SIZE:-1536M}
# What goes into the guest: the cloud kernel (virtio built for clouds),
# OpenSSH, cloud-init, ifupdown (cloud-init's ENI renderer), iproute2 for
# the tests' `ip`, acpid so an ACPI power button (the runtime's Stop) shuts
# the guest down without logind and dbus. Recommends stay out.
packages=linux-image-cloud-amd64,openssh-server,cloud-init,ifupdown,iproute2,systemd-sysv,udev,kmod,e2fsprogs,initramfs-tools,acpid
cmdline="root=/dev/vda rw console=ttyS0 net.ifnames=0 biosdevname=0 quiet loglevel=3 mitigations=off nowatchdog tsc=reliable"

inputs=$( { cat "$0"; echo "$mirror $suite $size $packages"; } | sha256sum | cut -d' ' -f1)
if [[ -f $out/INPUTS && $(cat "$out/INPUTS") == "$inputs" && -f $out/rootfs.qcow2 && -f $out/vmlinuz && -f $out/initrd.img && -f $out/SHA256SUMS ]]; then
	echo "guest-image: $out is up to date ($inputs)"
	exit 0
fi
for c in debootstrap qemu-img mkfs.ext4 chroot; do
	command -v "$c" >/dev/null || { echo "guest-image: $c is missing; apt-get install -y debootstrap qemu-utils e2fsprogs" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "guest-image: needs root (debootstrap, chroot)" >&2; exit 1; }

start=$(date +%s)
work=$(mktemp -d "${TMPDIR:-/tmp}/bc-guest-image.XXXXXX")
root=$work/root
cleanup() {
	for m in dev/pts dev proc sys; do umount -l "$root/$m" 2>/dev/null || true; done
	rm -rf "$work"
}
trap cleanup EXIT

# debootstrap's resolver does not follow virtual packages (cloud-init's
# python3-cryptography needs python3-cffi-backend-api-*), so it lays down
# minbase and apt installs the rest in the chroot.
mkdir -p "$out/.debs"
debootstrap --variant=minbase --cache-dir="$out/.debs" "$suite" "$root" "$mirror"
mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
# No daemon starts inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d" && chmod +x "$root/usr/sbin/policy-rc.d"
cp "$out/.debs"/*.deb "$root/var/cache/apt/archives/" 2>/dev/null || true
chroot "$root" apt-get update -qq
DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends ${packages//,/ }
cp -n "$root"/var/cache/apt/archives/*.deb "$out/.debs/" 2>/dev/null || true
rm -f "$root/usr/sbin/policy-rc.d"

# Configuration in the image. Host keys are not baked in: each guest gets
# its own key and CA-signed certificate from its seed (write_files below is
# what internal/agent/runtime's seed writes), so sshd waits for cloud-init.
rm -f "$root"/etc/ssh/ssh_host_*
mkdir -p "$root/etc/systemd/system/ssh.service.d"
cat >"$root/etc/systemd/system/ssh.service.d/10-after-cloud-init.conf" <<'UNIT'
[Unit]
# Host key, certificate and TrustedUserCAKeys come from the seed.
After=cloud-init.service
Wants=cloud-init.service
UNIT
cat >"$root/etc/cloud/cloud.cfg.d/90-better-compute.cfg" <<'CFG'
# Only the NoCloud seed the runtime attaches; no network metadata probing.
datasource_list: [NoCloud, None]
# The seed brings its own host key and certificate.
ssh_deletekeys: false
ssh_genkeytypes: []
disable_root: true
# Fewer modules: each one costs seconds under TCG.
cloud_init_modules: [bootcmd, write_files, growpart, resizefs, set_hostname, update_hostname, update_etc_hosts, users_groups, ssh]
cloud_config_modules: [runcmd]
cloud_final_modules: [scripts_per_once, scripts_per_boot, scripts_per_instance, scripts_user, final_message]
CFG
# The runtime's Stop presses the ACPI power button.
mkdir -p "$root/etc/acpi/events"
printf 'event=button/power.*\naction=/bin/systemctl poweroff\n' >"$root/etc/acpi/events/better-compute-power"
echo button >"$root/etc/modules-load.d/better-compute.conf"
echo "/dev/vda / ext4 defaults,noatime 0 0" >"$root/etc/fstab"
echo "guest" >"$root/etc/hostname"
cat >"$root/etc/network/interfaces" <<'ENI'
auto lo
iface lo inet loopback
source /etc/network/interfaces.d/*
ENI
# A small initramfs: only what a virtio guest needs to mount its root.
echo MODULES=list >"$root/etc/initramfs-tools/conf.d/better-compute"
printf '%s\n' virtio_pci virtio_blk virtio_net virtio_balloon ext4 vfat nls_cp437 nls_iso8859_1 iso9660 >>"$root/etc/initramfs-tools/modules"
chroot "$root" update-initramfs -u -k all
# Units a short-lived guest does not need, and that slow a TCG boot.
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service \
	fstrim.timer getty@tty1.service systemd-pstore.service ssh-keygen.service 2>/dev/null || true
chroot "$root" systemctl mask systemd-networkd-wait-online.service 2>/dev/null || true
for m in dev proc sys; do umount -l "$root/$m"; done

kernel=$(ls "$root"/boot/vmlinuz-* | sort -V | tail -1)
initrd=$(ls "$root"/boot/initrd.img-* | sort -V | tail -1)
mkdir -p "$out"
cp "$kernel" "$out/vmlinuz.tmp" && cp "$initrd" "$out/initrd.img.tmp"
# Smaller: no docs, man pages, locales, apt lists or caches, no /boot copy.
rm -rf "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
	"$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/boot/* "$root"/var/log/*.log

mkfs.ext4 -q -F -L rootfs -d "$root" "$work/root.raw" "$size"
qemu-img convert -O qcow2 "$work/root.raw" "$out/rootfs.qcow2.tmp"
mv "$out/rootfs.qcow2.tmp" "$out/rootfs.qcow2"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"
mv "$out/initrd.img.tmp" "$out/initrd.img"
echo "$cmdline" >"$out/cmdline"
(cd "$out" && sha256sum rootfs.qcow2 vmlinuz initrd.img >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
echo "$inputs" >"$out/INPUTS"
echo "guest-image: built $out in $(( $(date +%s) - start ))s: $(du -sh --apparent-size "$out/rootfs.qcow2" | cut -f1) qcow2 ($(qemu-img info --output=json "$out/rootfs.qcow2" | grep -m1 '"actual-size"' | tr -dc 0-9) bytes on disk)"
