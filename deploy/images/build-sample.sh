#!/usr/bin/env bash
# Build the sample deployable image: a raw BIOS-bootable disk whose one FAT
# partition holds syslinux, Debian's kernel and an initramfs (busybox-static,
# the kernel modules a VM or a common server needs, bcd) whose /init joins
# the control plane with bcd in node mode. Needs no root: the disk is
# assembled in files (sfdisk, mkfs.fat, mtools, syslinux's mtools installer).
#
#   deploy/images/build-sample.sh [OUT_DIR]     (default: bin/sample-image)
#
# Writes OUT_DIR/sample.raw (the disk), plus vmlinuz and initrd.img (the
# same files as on the disk, for a PXE boot without the disk) and SHA256SUMS.
# Debian packages: linux-image (downloaded, not installed), busybox-static,
# syslinux, syslinux-common, mtools, dosfstools, fdisk, cpio, kmod.
#
# Reproducible: with the same kernel package, busybox-static, syslinux and Go
# toolchain, two runs write the same bytes (every timestamp is
# SOURCE_DATE_EPOCH, file lists are sorted, gzip -n, FAT volume id and disk id
# are fixed). KERNEL_PKG pins the kernel (default: what linux-image-amd64
# depends on now).
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-$repo/bin/sample-image}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1767225600} # 2026-01-01T00:00:00Z
export TZ=UTC LC_ALL=C

need() {
	for c in "$@"; do
		command -v "$c" >/dev/null || {
			echo "build-sample: $c is missing; apt-get install -y busybox-static syslinux syslinux-common mtools dosfstools fdisk cpio kmod" >&2
			exit 1
		}
	done
}
need apt-get dpkg-deb sfdisk mkfs.fat mcopy syslinux cpio gzip modprobe depmod go
busybox=/bin/busybox
mbr=/usr/lib/syslinux/mbr/mbr.bin
for f in "$busybox" "$mbr"; do
	[[ -f $f ]] || { echo "build-sample: $f is missing (busybox-static, syslinux-common)" >&2; exit 1; }
done
# busybox-static puts a static busybox at /bin/busybox (the dynamic busybox
# package conflicts with it); the initramfs has no libc for anything else.

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The kernel: downloaded and unpacked, never installed (no hooks run).
pkg=${KERNEL_PKG:-$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')}
[[ -n $pkg ]] || { echo "build-sample: cannot resolve the kernel package; set KERNEL_PKG" >&2; exit 1; }
(cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || (cd "$work" && apt-get download "$pkg")
dpkg-deb -x "$work"/"$pkg"_*.deb "$work/kernel"
kver=$(ls "$work/kernel/lib/modules")
vmlinuz="$work/kernel/boot/vmlinuz-$kver"

# bcd, static and without build paths.
CGO_ENABLED=0 go build -C "$repo" -trimpath -buildvcs=false -ldflags='-s -w' -o "$work/bcd" ./cmd/bcd

# The initramfs tree.
rd="$work/initramfs"
mkdir -p "$rd"/{bin,sbin,dev,proc,sys,run,tmp,etc,boot,var/lib/bcd,usr/share/udhcpc}
cp "$busybox" "$rd/bin/busybox"
for applet in sh mount umount mkdir cat ip udhcpc modprobe insmod sleep findfs grep sed ln ls echo poweroff reboot; do
	ln -s busybox "$rd/bin/$applet"
done
cp "$work/bcd" "$rd/bin/bcd"

# Kernel modules with their dependencies: networking (QEMU's virtio and
# e1000, Intel server NICs), raw sockets for DHCP, disks (to read the boot
# partition's bcd.env), FAT, and cgroups are built in.
depmod -b "$work/kernel" "$kver" # the package ships no modules.dep
mkdir -p "$rd/lib/modules/$kver"
modules="virtio_pci virtio_net e1000 e1000e igb ixgbe af_packet virtio_blk virtio_scsi ahci ata_piix sd_mod nvme vfat nls_cp437 nls_ascii"
for m in $modules; do
	modprobe -d "$work/kernel" -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" {print $2}'
done | sort -u | while read -r ko; do
	rel=${ko#"$work/kernel"}
	mkdir -p "$rd$(dirname "$rel")"
	cp "$ko" "$rd$rel"
done
cp "$work/kernel/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$rd/lib/modules/$kver/"
depmod -b "$rd" "$kver"

cat >"$rd/usr/share/udhcpc/default.script" <<'EOF'
#!/bin/sh
# udhcpc's hook: configure the lease on the interface.
case "$1" in
deconfig) ip addr flush dev "$interface"; ip link set "$interface" up ;;
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	[ -n "$router" ] && ip route replace default via "${router%% *}" dev "$interface"
	: >/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	;;
esac
exit 0
EOF
chmod 755 "$rd/usr/share/udhcpc/default.script"

cat >"$rd/init" <<EOF
#!/bin/sh
# The sample image's init: bring up the network and run bcd in node mode.
# Its join settings come from bcd.env on the boot partition (the deploy
# step writes it: BCD_SERVER=host:port and BCD_JOIN_TOKEN=...), or from the
# kernel command line (bc.server=, bc.token=).
export PATH=/bin
mount -t devtmpfs dev /dev
mount -t proc proc /proc
mount -t sysfs sys /sys
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "sample image: kernel \$(cat /proc/sys/kernel/osrelease), bcd node mode"
for m in $modules; do modprobe -q \$m; done
sleep 1
for a in \$(cat /proc/cmdline); do
	case "\$a" in
	bc.server=*) BCD_SERVER=\${a#bc.server=} ;;
	bc.token=*) BCD_JOIN_TOKEN=\${a#bc.token=} ;;
	esac
done
boot=\$(findfs LABEL=BCBOOT 2>/dev/null)
if [ -n "\$boot" ] && mount -t vfat -o ro "\$boot" /boot && [ -f /boot/bcd.env ]; then
	# The deploy wrote BCD_SERVER and BCD_JOIN_TOKEN into this slot;
	# never echo it (the token is a secret).
	. /boot/bcd.env
fi
if [ -n "\$BCD_ROOT_AUTHORIZED_KEY" ]; then
	# A dedicated-root lease: root answers to the lessee's key, and the
	# slot holds no server or token, so this system never joins the
	# platform.
	mkdir -p /root/.ssh && chmod 700 /root/.ssh
	echo "\$BCD_ROOT_AUTHORIZED_KEY" >/root/.ssh/authorized_keys && chmod 600 /root/.ssh/authorized_keys
	echo "sample image: dedicated-root lease: root's authorized key installed (\${BCD_ROOT_AUTHORIZED_KEY##* })"
fi
ip link set lo up
for dev in /sys/class/net/*; do
	n=\${dev##*/}
	[ "\$n" = lo ] && continue
	ip link set "\$n" up
	udhcpc -i "\$n" -n -q -t 10 -s /usr/share/udhcpc/default.script && break
done
if [ -z "\$BCD_SERVER" ]; then
	echo "sample image: no BCD_SERVER (bcd.env on the boot partition, or bc.server= on the command line); dropping to a shell"
	exec sh
fi
# bcd reads the token from its environment; its state (key, certificate)
# lives in RAM, so every boot joins again.
export BCD_JOIN_TOKEN
while true; do
	bcd --mode node --server "\$BCD_SERVER" --hardware none --state-dir /var/lib/bcd \\
		--cgroup-root /sys/fs/cgroup/bettercompute
	echo "sample image: bcd exited (\$?); restarting in 5s"
	sleep 5
done
EOF
chmod 755 "$rd/init"

# A reproducible newc archive: sorted names, every mtime at the epoch.
find "$rd" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
initrd="$work/initrd.img"
(cd "$rd" && find . -print0 | sort -z | cpio --null -o -H newc --reproducible --owner=0:0 --quiet) | gzip -9 -n >"$initrd"

# The boot partition: FAT32 labelled BCBOOT with syslinux, the kernel, the
# initramfs; its volume id is fixed so the bytes repeat.
cat >"$work/syslinux.cfg" <<'EOF'
DEFAULT bcd
PROMPT 0
TIMEOUT 0
LABEL bcd
  KERNEL /vmlinuz
  INITRD /initrd.img
  APPEND console=tty0 console=ttyS0,115200n8 quiet
EOF
cp "$vmlinuz" "$work/vmlinuz"
# bcd.env is the config slot the deploy's machine.configure step rewrites
# in place (internal/agent/ramdisk/configure.go): 2048 bytes starting on a
# sector, a marker line first and last, a shell comment between. Copied
# last onto a fresh file system, its clusters are contiguous.
{
	printf '# bcd-config-slot v1\n#'
	printf '%*s' 2000 ''
	printf '\n# end of bcd-config-slot\n'
} >"$work/bcd.env"
[[ $(stat -c %s "$work/bcd.env") -eq 2048 ]] || { echo "build-sample: bcd.env slot is not 2048 bytes" >&2; exit 1; }
touch -d "@$SOURCE_DATE_EPOCH" "$work/vmlinuz" "$work/initrd.img" "$work/syslinux.cfg" "$work/bcd.env"
kb=$(( ( $(stat -c %s "$work/vmlinuz") + $(stat -c %s "$initrd") ) / 1024 + 8192 ))
part_mib=$(( kb / 1024 + 8 ))
[[ $part_mib -ge 40 ]] || part_mib=40 # FAT32 wants at least ~33 MiB
part="$work/part.img"
truncate -s "${part_mib}M" "$part"
mkfs.fat -F 32 -n BCBOOT -i 42434d50 --invariant "$part" >/dev/null 2>&1 || mkfs.fat -F 32 -n BCBOOT -i 42434d50 "$part" >/dev/null
export MTOOLS_SKIP_CHECK=1
mcopy -m -i "$part" "$work/vmlinuz" "$work/initrd.img" "$work/syslinux.cfg" "$work/bcd.env" ::/
syslinux --install "$part"

# The disk: an MBR with one bootable FAT32 (LBA) partition at 1 MiB.
disk="$work/sample.raw"
truncate -s "$(( part_mib + 1 ))M" "$disk"
printf 'label: dos\nlabel-id: 0x42434d50\nstart=2048, type=c, bootable\n' | sfdisk -q "$disk"
dd if="$mbr" of="$disk" bs=440 count=1 conv=notrunc status=none
dd if="$part" of="$disk" bs=1M seek=1 conv=notrunc status=none

mkdir -p "$out"
cp "$disk" "$work/vmlinuz" "$initrd" "$out/"
(cd "$out" && sha256sum sample.raw vmlinuz initrd.img >SHA256SUMS)
echo "build-sample: kernel $kver ($pkg); wrote $out:"
cat "$out/SHA256SUMS"
