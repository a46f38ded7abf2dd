#!/usr/bin/env bash
# ci/rxe-vm.sh 'COMMAND' — run COMMAND as root inside a QEMU virtual machine whose Linux
# kernel runs soft-RoCE (`rdma_rxe`), from the repository root, and exit with its status.
#
# Why a VM: dmem's rdma fabric needs a real verbs stack (kernel RDMA core + rdma-core's
# libibverbs and a provider). Hosts without an RNIC and without RDMA in their kernel (CI,
# containers) still have QEMU: the guest boots the distribution's own kernel, which ships
# `rdma_rxe`, and runs the host's own user space read-only over 9p, so the binaries built on
# the host (target/…) run unchanged against Debian's stock rdma-core.
#
# What the guest is:
#   - kernel /boot/vmlinuz-$RXE_VM_KERNEL (default: the newest *-amd64 under /lib/modules);
#   - a busybox initramfs that loads virtio, 9p and overlay modules, mounts the host's / over
#     9p read-only under a tmpfs overlay, and mounts the repository read-write at its own path
#     (writes to target/ or results land on the host);
#   - eth0 = 10.0.2.15/24 on QEMU's user network with `restrict=on` (the guest reaches nothing
#     outside itself; RoCE traffic to its own address stays in the guest);
#   - `rdma link add rxe0 type rxe netdev eth0`: device rxe0, RoCE v2, GID index 1 is the
#     IPv4-mapped address; `ulimit -l unlimited` before COMMAND (memory registration).
#
# Exit status: COMMAND's; 125 when the VM or soft-RoCE could not be brought up (never 0:
# a CI step that needs the VM fails where the VM cannot start). Environment:
#   RXE_VM_MEM (default 3G), RXE_VM_SMP (2), RXE_VM_TIMEOUT (seconds, 1800),
#   RXE_VM_ACCEL (tcg | kvm; default tcg — nested KVM without vmx/svm hangs the guest),
#   RXE_VM_WORK (scratch for the initramfs, default ${TMPDIR:-/tmp}/dmem-rxe-vm),
#   RXE_VM_KERNEL (a version under /lib/modules).
# Needs root and Debian's packages: qemu-system-x86 linux-image-amd64 rdma-core
# ibverbs-providers busybox-static kmod cpio (`ci/rxe-vm.sh --install` installs them).
set -u

die() { echo "rxe-vm: $*" >&2; exit 125; }
packages="qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils busybox-static kmod cpio"

if [ "${1:-}" = "--install" ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq $packages >/dev/null || die "apt-get install failed"
  exit 0
fi
[ $# -eq 1 ] || { echo "usage: ci/rxe-vm.sh 'COMMAND' | --install" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (9p export of / and the guest's modules)"
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 missing: ci/rxe-vm.sh --install"
[ -x /bin/busybox ] || die "busybox missing: ci/rxe-vm.sh --install (busybox-static)"

repo=$(cd "$(dirname "$0")/.." && pwd)
kernel=${RXE_VM_KERNEL:-$(ls /lib/modules 2>/dev/null | grep -- '-amd64$' | sort -V | tail -n 1)}
[ -n "$kernel" ] && [ -f "/boot/vmlinuz-$kernel" ] || die "no Debian amd64 kernel in /boot: ci/rxe-vm.sh --install"
work=${RXE_VM_WORK:-${TMPDIR:-/tmp}/dmem-rxe-vm}
mkdir -p "$work" || die "cannot create $work"
initrd=$work/initramfs-$kernel.cpio.gz

build_initramfs() {
  local root; root=$(mktemp -d) || return 1
  mkdir -p "$root"/{bin,mods,proc,sys,dev,host,upper,newroot}
  cp /bin/busybox "$root/bin/busybox" || return 1
  # Each module with its dependencies, in load order, once.
  local m
  for m in virtio_pci virtio_net 9pnet_virtio 9p overlay; do
    modprobe -S "$kernel" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
  done | awk '!seen[$0]++' > "$root/order.full" || return 1
  [ -s "$root/order.full" ] || return 1
  while read -r f; do cp "$f" "$root/mods/" || return 1; basename "$f"; done < "$root/order.full" > "$root/order"
  cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /order); do insmod "/mods/$m" 2>/dev/null; done
arg() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" /proc/cmdline; }
REPO=$(arg dmem_repo)
give_up() { echo "rxe-vm guest: $*"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host_root /host || give_up "9p mount of / failed"
mount -t tmpfs -o size=50% tmpfs /upper && mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work /newroot || give_up "overlay failed"
for d in proc sys dev; do mount --move "/$d" "/newroot/$d"; done
for d in tmp run dev/shm; do mkdir -p "/newroot/$d"; mount -t tmpfs tmpfs "/newroot/$d"; done
mkdir -p /newroot/dev/pts && mount -t devpts devpts /newroot/dev/pts
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 repo "/newroot$REPO" || give_up "9p mount of the repository failed"
exec switch_root /newroot /bin/bash "$REPO/target/rxe-vm/guest.sh"
EOF
  chmod +x "$root/init"
  (cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$initrd.tmp" && mv "$initrd.tmp" "$initrd"
  local rc=$?; rm -rf "$root"; return $rc
}
[ -s "$initrd" ] || build_initramfs || die "could not build the initramfs (modprobe -S $kernel, cpio, gzip)"

# The guest's second stage lives in the repository (target/, ignored by git) so the guest
# finds it at the same path; the exit status comes back the same way.
control=$repo/target/rxe-vm
rm -rf "$control" && mkdir -p "$control" || die "cannot write $control"
printf '%s\n' "$1" > "$control/command"
cat > "$control/guest.sh" <<EOF
#!/bin/bash
# Second stage, inside the guest (written by ci/rxe-vm.sh).
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
export CARGO_HOME=\${CARGO_HOME:-/root/.cargo} RUSTUP_HOME=\${RUSTUP_HOME:-/root/.rustup}
status=125
finish() { echo "\$status" > "$control/status"; sync; umount "$repo" 2>/dev/null; busybox poweroff -f; }
trap finish EXIT
ip link set lo up && ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 || { echo "rxe-vm guest: network"; exit; }
# rdma_rxe after switch_root: from the initramfs its crc32 dependency does not load.
modprobe rdma_rxe || { echo "rxe-vm guest: modprobe rdma_rxe failed"; exit; }
rdma link add rxe0 type rxe netdev eth0 || { echo "rxe-vm guest: rdma link add failed"; exit; }
ulimit -l unlimited
cd "$repo" || exit
bash -c "\$(cat "$control/command")"
status=\$?
EOF

if [ "${RXE_VM_ACCEL:-tcg}" = kvm ]; then accel=(-enable-kvm -cpu host); else accel=(-accel tcg,thread=multi -cpu max); fi
echo "rxe-vm: kernel $kernel, ${accel[*]}, ${RXE_VM_SMP:-2} CPUs, ${RXE_VM_MEM:-3G}; running: $1" >&2
timeout "${RXE_VM_TIMEOUT:-1800}" qemu-system-x86_64 "${accel[@]}" \
  -m "${RXE_VM_MEM:-3G}" -smp "${RXE_VM_SMP:-2}" -nographic -no-reboot \
  -kernel "/boot/vmlinuz-$kernel" -initrd "$initrd" \
  -append "console=ttyS0 loglevel=3 panic=-1 dmem_repo=$repo" \
  -virtfs local,path=/,mount_tag=host_root,security_model=none,readonly=on,multidevs=remap \
  -virtfs "local,path=$repo,mount_tag=repo,security_model=none" \
  -netdev user,id=net0,restrict=on -device virtio-net-pci,netdev=net0 </dev/null
qemu=$?
status=$(cat "$control/status" 2>/dev/null)
[ -n "$status" ] || die "the guest reported no exit status (qemu exit $qemu; 124 = RXE_VM_TIMEOUT)"
exit "$status"
