#!/usr/bin/env bash
# Coverage-guided fuzzing of the iWARP parsers (crates/rdapl-iwarp/fuzz):
# every target, or those named, for RUNS executions each (default 10
# million: the slowest target, connection, takes about 20 minutes of one
# core), on a corpus seeded from the fuzz smoke test's valid inputs. Prints
# each target's executions and time; a crash stops the script with
# libFuzzer's report and the input under crates/rdapl-iwarp/fuzz/artifacts/.
#
#   scripts/fuzz.sh                       # every target, 10 million runs each
#   RUNS=100000 scripts/fuzz.sh connection fpdu_stream
#
# Needs nightly and cargo-fuzz (`cargo install cargo-fuzz`); the test suite
# runs only the stable smoke test (crates/rdapl-iwarp/tests/fuzz_smoke.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${RUNS:-10000000}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(connection fpdu_stream mpa_frame ddp_header rdmap_bodies)
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "fuzz: needs nightly and cargo-fuzz (rustup toolchain install nightly; cargo install cargo-fuzz)"
  exit 1
fi

fuzz=crates/rdapl-iwarp/fuzz
FUZZ_WRITE_CORPUS="$PWD/$fuzz/corpus" \
  cargo test -q -p rdapl-iwarp --test fuzz_smoke write_corpus_if_asked >/dev/null
for t in "${targets[@]}"; do
  log="$(mktemp)"
  (cd "$fuzz" && cargo +nightly fuzz run -O "$t" "corpus/$t" -- \
    -runs="$runs" -print_final_stats=1) >"$log" 2>&1 || {
    tail -40 "$log"
    echo "fuzz: $t FAILED (log: $log)"
    exit 1
  }
  done_line="$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)"
  echo "fuzz: $t: ${done_line:-?}, no crash"
  rm -f "$log"
done
