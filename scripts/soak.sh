#!/usr/bin/env bash
# Soak: runs a crate's test binaries again and again, each in turn, under
# the tcp provider's parameter sets in rotation, until MINUTES are over,
# to find the failures that one run of the suite does not show (races,
# timing, load). Not part of the test suite; a tool for whoever changes the
# providers.
#
#   scripts/soak.sh                  # rdapl-tcp's tests, 30 minutes
#   scripts/soak.sh 10 --hog         # 10 minutes, a busy loop on one CPU beside
#   scripts/soak.sh 60 rdapl-cli     # another crate's tests
#
# The release test binaries are built once, then copied out of target/:
# building again while it runs (another change) does not swap them under
# it. Each run is one binary under one set (the binary's own tests pin
# what they assume, as in test-all.sh); a failing run's output is kept in
# the soak's directory (printed at the start and the end) and the script
# exits 1 if any run failed. A run is bounded to 5 minutes.
#
# The sets: the defaults, `complete=sent`, `crc=0`, `mss=700`, all three,
# and `wait_spin_us=0,poll_yield=4` (a waiting or polling consumer that
# gives its CPU away at once).
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=30
crate=rdapl-tcp
hog=0
for a in "$@"; do
  case "$a" in
    --hog) hog=1 ;;
    [0-9]*) minutes="$a" ;;
    *) crate="$a" ;;
  esac
done
sets=("" "complete=sent" "crc=0" "mss=700" "complete=sent,crc=0,mss=700" "wait_spin_us=0,poll_yield=4")

out="$(mktemp -d "${TMPDIR:-/tmp}/rdapl-soak.XXXXXX")"
echo "soak: $crate's tests for $minutes minutes; logs in $out"
if ! cargo test --release -p "$crate" --no-run >"$out/build.log" 2>&1; then
  cat "$out/build.log"
  echo "soak: the build of $crate's tests failed"
  exit 1
fi
# The executables cargo names ("Executable ... (target/release/deps/x-hash)").
mapfile -t bins < <(sed -n 's/^ *Executable .*(\(.*\))$/\1/p' "$out/build.log")
if [ ${#bins[@]} -eq 0 ]; then
  echo "soak: cargo named no test binary of $crate"
  exit 1
fi
mkdir -p "$out/bin"
for b in "${bins[@]}"; do cp "$b" "$out/bin/"; done

hog_pid=
if [ "$hog" = 1 ]; then
  (while :; do :; done) &
  hog_pid=$!
fi
trap '[ -n "$hog_pid" ] && kill "$hog_pid" 2>/dev/null; true' EXIT

end=$((SECONDS + minutes * 60))
runs=0
failed=0
round=0
while [ $SECONDS -lt $end ]; do
  round=$((round + 1))
  for set in "${sets[@]}"; do
    for b in "$out"/bin/*; do
      [ $SECONDS -lt $end ] || break 3
      name="$(basename "$b" | sed 's/-[0-9a-f]*$//')"
      runs=$((runs + 1))
      rc=0
      RDAPL_TCP_PARAMS="$set" timeout 300 "$b" -q >"$out/current.log" 2>&1 || rc=$?
      if [ $rc -ne 0 ]; then
        failed=$((failed + 1))
        log="$out/fail-$runs-$name.log"
        mv "$out/current.log" "$log"
        echo "soak: FAILED $name [${set:-defaults}] (exit $rc): $log"
      fi
    done
  done
done
rm -f "$out/current.log"
echo "soak: $runs runs in $round round(s), $failed failed; logs in $out"
[ $failed -eq 0 ]
