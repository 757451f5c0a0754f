# VM side of rdapl <-> kernel siw interoperability scenarios, driven by a
# host program (crates/rdapl-cli/tests/siw.rs) through files in the run
# folder: the VM writes $OUT/NAME.ready / NAME.vm.rc / NAME.vm.done, the host
# writes /mnt/host/NAME.go (its listener is up) and /mnt/host/NAME.done (its
# client finished). A generated run script sources this file and calls:
#
#   interop_init                 siw0 on eth0, tcpdump of all TCP to interop.pcap
#   vm_server NAME PORT CMD...   CMD (a server on 10.0.2.15:PORT, hostfwd'ed
#                                to host 127.0.0.1:PORT) runs until the host's
#                                client is done; NAME.ready once PORT listens;
#                                stdout in NAME.vm.txt, stderr in NAME.vm.err
#   vm_client NAME CMD...        once the host listens, CMD (a client of
#                                10.0.2.100:PORT, guestfwd'ed to host
#                                127.0.0.1:PORT) runs; NAME.vm.txt/.err
#   interop_end                  stops the capture, kernel warnings to run.log
#
# Every wait is bounded (T, default 60 s per step).
. "$LAB/tests/lib.sh"
T=${T:-60}

interop_init() {
  modprobe -a siw rdma_ucm ib_uverbs
  rdma link add siw0 type siw netdev "$ETH"; rdma link
  cap_start "$ETH" interop "tcp"
}

# wait_host FILE SECS: until /mnt/host/FILE exists; 1 if it never does
wait_host() {
  local i; for i in $(seq $(( $2 * 5 ))); do [ -e "/mnt/host/$1" ] && return 0; sleep 0.2; done; return 1
}

vm_server() {
  local name=$1 port=$2 p rc; shift 2
  say "$name (VM server on $VM_IP:$port): $*"
  timeout -k 5 "$T" stdbuf -oL "$@" > "$OUT/$name.vm.txt" 2> "$OUT/$name.vm.err" & p=$!
  # ready once the kernel's listening socket (iw_cm's) is up
  for i in $(seq $(( T * 5 ))); do
    ss -Hltn "sport = :$port" | grep -q . && break; kill -0 $p 2>/dev/null || break; sleep 0.2
  done
  touch "$OUT/$name.ready"
  wait_host "$name.done" "$T" || echo "$name: the host's client never finished"
  # the server ends when its client disconnects
  for i in $(seq 50); do kill -0 $p 2>/dev/null || break; sleep 0.2; done
  kill $p 2>/dev/null; wait $p; rc=$?
  echo $rc > "$OUT/$name.vm.rc"; touch "$OUT/$name.vm.done"
  tail -n 3 "$OUT/$name.vm.txt" | cut -c1-200; cat "$OUT/$name.vm.err"; result "$name" "VM side rc=$rc"
}

vm_client() {
  local name=$1 rc; shift
  say "$name (VM client): $*"
  if ! wait_host "$name.go" "$T"; then
    echo 124 > "$OUT/$name.vm.rc"; touch "$OUT/$name.vm.done"
    result "$name" "the host never listened"; return
  fi
  timeout -k 5 "$T" stdbuf -oL "$@" > "$OUT/$name.vm.txt" 2> "$OUT/$name.vm.err"; rc=$?
  echo $rc > "$OUT/$name.vm.rc"; touch "$OUT/$name.vm.done"
  tail -n 3 "$OUT/$name.vm.txt" | cut -c1-200; cat "$OUT/$name.vm.err"; result "$name" "VM side rc=$rc"
}

interop_end() {
  cap_stop
  echo "--- kernel messages from siw and the RDMA core"
  grep -E 'BUG|WARN|crc error|siw: |iw_cm|TERMINATE' "$OUT/dmesg.txt" | grep -v 'siw0: ' | tail -n 40
}
