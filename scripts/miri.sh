#!/usr/bin/env bash
# Runs the tests of rdapl's `unsafe` code under Miri (nightly's interpreter
# that reports undefined behaviour: aliasing violations under Stacked
# Borrows, data races, use after free, uninitialised reads):
#
# * rdapl-core's unit tests: the EVD's lock-free ring (`evd/ring.rs`, with
#   producers, consumers and a resize on several threads), the region
#   memory and the registration tables (`mem/`), the provider's gather;
# * the borrowed LMRs (`crates/rdapl/tests/lmr_borrowed.rs`: raw memory
#   registered for a scope, RDMA into it, writes racing with its release).
#
# Needs a nightly toolchain with the miri and rust-src components
# (`rustup component add --toolchain nightly miri rust-src`). Without one it
# prints why and exits 0, unless RDAPL_REQUIRE_MIRI=1 (set by .ci/run when
# it could install them), which makes that a failure. About three minutes
# on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly miri --version >/dev/null 2>&1; then
  if [ "${RDAPL_REQUIRE_MIRI:-0}" = "1" ]; then
    echo "miri: no nightly toolchain with Miri, and RDAPL_REQUIRE_MIRI=1"; exit 1
  fi
  echo "miri: SKIPPED (no nightly toolchain with Miri; rustup component add --toolchain nightly miri rust-src)"
  exit 0
fi

# parking_lot casts integers to pointers (permissive provenance); the
# dispatch threads outlive a test's main thread (leaks are not the question).
export MIRIFLAGS="${MIRIFLAGS:--Zmiri-permissive-provenance -Zmiri-ignore-leaks}"
cargo +nightly miri setup >/dev/null
cargo +nightly miri test -p rdapl-core --lib
cargo +nightly miri test -p rdapl --test lmr_borrowed
