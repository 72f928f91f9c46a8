#!/usr/bin/env bash
# Builds the commissioning ramdisk: Debian's 6.1 kernel (apt-get download +
# dpkg-deb -x, no install hooks), busybox-static, the modules a machine's
# NIC and disk need (virtio net/blk, e1000, insmod-ed from init), and a
# static bcd that runs in --mode ramdisk. Outputs vmlinuz and initrd.cpio.gz
# under $OUT (default .cache/ramdisk/out), byte for byte the same for the
# same inputs: files are sorted, owned by root, dated SOURCE_DATE_EPOCH,
# and gzip stores no name or time.
#
#   tools/ramdisk/build.sh            # or: make ramdisk
#   KERNEL_PKG=linux-image-6.1.0-42-amd64 tools/ramdisk/build.sh
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${RAMDISK_CACHE:-$ROOT/.cache/ramdisk}
OUT=${OUT:-$CACHE/out}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
# The newest 6.1 kernel this machine's apt sources carry, unless pinned.
KERNEL_PKG=${KERNEL_PKG:-$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' | awk '{print $1}' | sort -V | tail -1)}
[ -n "$KERNEL_PKG" ] || { echo "no linux-image-6.1.0-*-amd64 package in the apt sources (apt-get update?)" >&2; exit 1; }
# Modules for the NICs and disks of the machines we commission (QEMU's
# virtio and e1000); their dependencies come from modules.dep.
MODULES=${MODULES:-"virtio_pci virtio_net virtio_blk e1000"}

mkdir -p "$CACHE/debs" "$OUT"
cd "$CACHE/debs"
for pkg in "$KERNEL_PKG" busybox-static; do
	ls "${pkg}"_*.deb >/dev/null 2>&1 || apt-get download "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
	ls "${pkg}"_*.deb >/dev/null 2>&1 || { echo "apt-get download $pkg failed" >&2; exit 1; }
done

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
dpkg-deb -x "$CACHE/debs/${KERNEL_PKG}"_*.deb "$WORK/kernel"
dpkg-deb -x "$CACHE/debs"/busybox-static_*.deb "$WORK/busybox"
KVER=${KERNEL_PKG#linux-image-}
MODDIR="$WORK/kernel/lib/modules/$KVER"
[ -d "$MODDIR" ] || MODDIR="$WORK/kernel/usr/lib/modules/$KVER"
# The package leaves modules.dep to its install hook: make it here.
depmod -b "$WORK/kernel" "$KVER"

R="$WORK/root"
mkdir -p "$R"/{bin,sbin,dev,proc,sys,run,tmp,etc,lib/modules,var/lib/bcd,usr/share/udhcpc}
cp "$WORK/busybox/bin/busybox" "$R/bin/busybox"
for applet in sh mount umount insmod ip udhcpc sleep cat echo mkdir ls dmesg poweroff reboot sync; do
	ln -s busybox "$R/bin/$applet"
done

# The modules, dependencies first, decompressed (busybox insmod takes
# plain .ko files).
resolve() { # module name -> its file and its dependencies' files, deps first
	local name=$1 path deps
	path=$(grep -E "(^|/)${name//_/[-_]}\.ko(\.xz|\.zst)?:" "$MODDIR/modules.dep" | head -1) || true
	[ -n "$path" ] || return 0 # built in
	deps=${path#*:}
	for d in $deps; do resolve "$(basename "${d%%.ko*}")"; done
	echo "${path%%:*}"
}
: > "$R/etc/modules"
for m in $MODULES; do resolve "$m"; done | awk '!seen[$0]++' | while read -r rel; do
	base=$(basename "${rel%%.ko*}").ko
	case "$rel" in
	*.xz) xz -dc "$MODDIR/$rel" > "$R/lib/modules/$base" ;;
	*.zst) zstd -dcq "$MODDIR/$rel" > "$R/lib/modules/$base" ;;
	*) cp "$MODDIR/$rel" "$R/lib/modules/$base" ;;
	esac
	echo "$base" >> "$R/etc/modules"
done

(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -buildid= -X main.version=${BCD_VERSION:-ramdisk}" -o "$R/bin/bcd" ./cmd/bcd)

cat > "$R/usr/share/udhcpc/default.script" <<'SCRIPT'
#!/bin/sh
# udhcpc's hook: configure the lease on the interface.
case "$1" in
bound|renew)
	ip addr flush dev "$interface"
	ip addr add "$ip/${mask:-24}" dev "$interface"
	[ -n "$router" ] && ip route replace default via "${router%% *}" dev "$interface"
	;;
esac
exit 0
SCRIPT
cat > "$R/init" <<'SCRIPT'
#!/bin/sh
# The commissioning ramdisk: load the NIC and disk drivers, take a DHCP
# lease, run bcd --mode ramdisk (it reads bc.server and bc.token from the
# kernel command line). If bcd ends, power off: the control plane decides
# what boots next.
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
while read -r m; do insmod "/lib/modules/$m" 2>/dev/null; done < /etc/modules
ip link set lo up
for n in /sys/class/net/*; do
	i=${n##*/}
	[ "$i" = lo ] && continue
	ip link set "$i" up
	udhcpc -i "$i" -n -q -t 10 -s /usr/share/udhcpc/default.script && break
done
echo "bcd-ramdisk: starting bcd"
/bin/bcd --mode ramdisk --state-dir /run/bcd --metrics-listen "" --log-level info
echo "bcd-ramdisk: bcd exited ($?)"
sync
poweroff -f
SCRIPT
chmod 0755 "$R/init" "$R/usr/share/udhcpc/default.script"

find "$R" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$R" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --reproducible --owner=0:0 --quiet) | gzip -n -9 > "$OUT/initrd.cpio.gz"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
(cd "$OUT" && sha256sum vmlinuz initrd.cpio.gz > SHA256SUMS)
echo "$KERNEL_PKG" > "$OUT/KERNEL"
ls -l "$OUT"
