#!/bin/bash
# usage: run.sh [-t SECS] [-G] [-i] SCRIPT [PORT...]
# Boots the lab VM (TCG; ACCEL=kvm for KVM) on a throw-away snapshot
# of $LAB_DATA/disk.raw, runs SCRIPT inside it at boot and powers off.
#   run folder  $LAB_DATA/runs/<time>-<name>/ : SCRIPT is copied there as run.sh,
#               shared as /mnt/host; the VM writes out/ (run.log, rc, pcaps...)
#   this folder is shared read-only as /mnt/lab (helpers, probes)
#   PORT        hostfwd 127.0.0.1:PORT (host) -> 10.0.2.15:PORT (VM), tcp
#   GUESTFWD="P.." env: VM connections to 10.0.2.100:P reach host 127.0.0.1:P
#   HOST_HOOK=cmd env: run on the host alongside the VM (env RUN, OUT set)
#   -G          slirp restrict=off (lets the VM reach host loopback as 10.0.2.2;
#               the VM has host routes to 10.0.2.2/.100 only), default restrict=on
#   -i          interactive: serial console on this terminal, no SCRIPT needed
#   -t SECS     hard limit for the whole run (default 300)
#   ACCEL=kvm   env: use KVM instead of TCG
#   LAB_RUN=DIR env: the run folder (default $LAB_DATA/runs/<time>-<name>)
set -euo pipefail
LAB_DATA=${LAB_DATA:-/var/tmp/rdapl-lab}
HERE=$(cd "$(dirname "$0")" && pwd)
TMO=300 restrict=on inter=0
while getopts t:Gi o; do case $o in t) TMO=$OPTARG;; G) restrict=off;; i) inter=1;; *) exit 2;; esac; done
shift $((OPTIND-1))
if [ $inter = 1 ]; then SCRIPT=${1:-}; else SCRIPT=${1:?usage: run.sh [-t SECS] [-G] [-i] SCRIPT [PORT...]}; fi
[ $# -gt 0 ] && shift
RUN=${LAB_RUN:-$LAB_DATA/runs/$(date +%Y%m%d-%H%M%S)-$(basename "${SCRIPT:-interactive}" .sh)}
OUT=$RUN/out; mkdir -p "$OUT"
[ -n "$SCRIPT" ] && cp "$SCRIPT" "$RUN/run.sh"
echo "PORTS='$*' GUESTFWD='${GUESTFWD:-}'" > "$RUN/env"    # sourced by lab-run
net="user,id=n0,ipv6=off,restrict=$restrict,net=10.0.2.0/24,host=10.0.2.2"
for p in "$@"; do net="$net,hostfwd=tcp:127.0.0.1:$p-10.0.2.15:$p"; done
for p in ${GUESTFWD:-}; do net="$net,guestfwd=tcp:10.0.2.100:$p-cmd:socat STDIO TCP4:127.0.0.1:$p"; done
# TCG by default: on this host /dev/kvm is kvm_pvm (no VMX), which cannot run
# a stock kernel (see README).  ACCEL=kvm tries it anyway.
if [ "${ACCEL:-tcg}" = kvm ]; then accel=(-accel kvm -cpu host); else accel=(-accel tcg -cpu max); fi
args=("${accel[@]}" -m 2048 -smp 2 -no-reboot -display none
  -kernel "$LAB_DATA/boot/vmlinuz" -initrd "$LAB_DATA/boot/initrd.img"
  -append "console=ttyS0 root=/dev/vda rw net.ifnames=0 ipv6.disable=1 panic=1 quiet"
  -drive "file=$LAB_DATA/disk.raw,format=raw,if=virtio,snapshot=on"
  -netdev "$net" -device virtio-net-pci,netdev=n0
  -virtfs "local,path=$RUN,mount_tag=host,security_model=none,id=host"
  -virtfs "local,path=$HERE,mount_tag=lab,security_model=none,readonly=on,id=lab")
echo "run: $RUN  accel: ${accel[*]}  net: $net" | tee "$RUN/host.log"
if [ $inter = 1 ]; then exec timeout "$TMO" qemu-system-x86_64 "${args[@]}" -serial mon:stdio; fi

t0=$(date +%s%N)
timeout --kill-after=5 "$TMO" qemu-system-x86_64 "${args[@]}" -monitor none \
  -serial "file:$RUN/console.log" </dev/null >>"$RUN/host.log" 2>&1 &
QPID=$!
HPID=
if [ -n "${HOST_HOOK:-}" ]; then
  (export RUN OUT; timeout "$TMO" bash -c "$HOST_HOOK") >"$RUN/host-hook.log" 2>&1 & HPID=$!
fi
tb= te=
el() { local n; n=$(date +%s%N); printf %d.%02d $(( (n-t0)/1000000000 )) $(( (n-t0)/10000000%100 )); }
while kill -0 $QPID 2>/dev/null; do
  [ -z "$tb" ] && [ -e "$OUT/uptime-at-start" ] && tb=$(el)
  [ -z "$te" ] && [ -e "$OUT/rc" ] && te=$(el)
  sleep 0.1
done
wait $QPID && qrc=0 || qrc=$?
tq=$(el)
[ -n "$HPID" ] && { wait $HPID || echo "host hook rc=$?" >> "$RUN/host.log"; }
{ echo "qemu rc=$qrc  script rc=$(cat "$OUT/rc" 2>/dev/null || echo none)"
  echo "timing (host clock, s): script started ${tb:-never} (guest uptime $(cat "$OUT/uptime-at-start" 2>/dev/null))," \
       "script done ${te:-never}, qemu exited $tq"; } | tee -a "$RUN/host.log"
echo "output: $OUT"
