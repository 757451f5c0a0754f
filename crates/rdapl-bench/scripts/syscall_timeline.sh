#!/usr/bin/env bash
# Records a ping-pong's system calls with perf's syscall tracepoints and
# prints where its one-way time goes (syscall_timeline.py): each write's
# time in the kernel, the user-space work between a message's writes,
# the turnaround from the last read of the peer's message to the reply's
# first write, and the delivery from a write's return to the peer's read.
# Works where hardware counters do not (VMs): it needs only tracepoints,
# root (or a permissive perf_event_paranoid) and tracefs mounted
# (`mount -t tracefs nodev /sys/kernel/tracing` where it is not).
#
#   crates/rdapl-bench/scripts/syscall_timeline.sh rdapl 64k 3000 48800
#   crates/rdapl-bench/scripts/syscall_timeline.sh fi 65536 3000 48801
#   RDAPL_ARGS="--params crc=0" crates/rdapl-bench/scripts/syscall_timeline.sh rdapl 64k 3000 48802
#
# PROGRAM is rdapl (target/release/rdapl, or $RDAPL; server and client
# with --buffers 1) or fi (fi_pingpong -p tcp -e msg). SIZE takes k/m
# suffixes for rdapl; for fi give bytes. Both ends run on 127.0.0.1:PORT.
# The tracepoints slow every program a little: compare programs within
# one recording session, not with untraced runs. Leaves the recording in
# $OUT (default /tmp/syscall-timeline.PROGRAM.txt).
set -euo pipefail
cd "$(dirname "$0")/../../.."

prog="${1:?PROGRAM: rdapl or fi}"
size="${2:?SIZE}"
iters="${3:?ITERS}"
port="${4:?PORT}"
out="${OUT:-/tmp/syscall-timeline.$prog.txt}"
data="$(mktemp)"
trap 'rm -f "$data"' EXIT

events=(
  -e syscalls:sys_enter_sendmsg -e syscalls:sys_exit_sendmsg
  -e syscalls:sys_enter_sendto -e syscalls:sys_exit_sendto
  -e syscalls:sys_exit_recvfrom --filter 'ret != -11'
  -e syscalls:sys_exit_readv --filter 'ret != -11'
)

if ! perf list 'syscalls:sys_enter_sendmsg' 2>/dev/null | grep -q sys_enter_sendmsg; then
  echo "perf sees no syscall tracepoints: run as root, with tracefs mounted" \
    "(mount -t tracefs nodev /sys/kernel/tracing)" >&2
  exit 1
fi

case "$prog" in
  rdapl)
    bin="${RDAPL:-target/release/rdapl}"
    [ -x "$bin" ] || { echo "no $bin: cargo build --release -p rdapl-cli --bin rdapl" >&2; exit 1; }
    # shellcheck disable=SC2086
    "$bin" pingpong -s -p tcp --once --buffers 1 -q "$port" ${RDAPL_ARGS:-} >/dev/null &
    server=$!
    sleep 0.5
    # shellcheck disable=SC2086
    client=("$bin" pingpong -p tcp --buffers 1 -q "$port" -S "$size" -I "$iters" ${RDAPL_ARGS:-} 127.0.0.1)
    ;;
  fi)
    fi_pingpong -p tcp -e msg -S "$size" -I "$iters" -B "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    client=(fi_pingpong -p tcp -e msg -S "$size" -I "$iters" -P "$port" 127.0.0.1)
    ;;
  *)
    echo "PROGRAM is rdapl or fi" >&2
    exit 1
    ;;
esac

perf record -q -o "$data" "${events[@]}" -a -- "${client[@]}" | tail -1
wait "$server" || true
perf script --ns -i "$data" -F comm,pid,tid,time,event,trace >"$out" 2>/dev/null
python3 crates/rdapl-bench/scripts/syscall_timeline.py "$out"
