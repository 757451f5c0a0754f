#!/usr/bin/env bash
# Runs the whole rdapl test suite: format, lint and rustdoc checks, every unit,
# integration and doc test of the workspace (all features), the loom
# models of the EVD and CNO protocols (--cfg rdapl_loom, on rdapl-core), of
# the object model (on rdapl-loopback) and of the tcp provider's connection
# lock (--cfg rdapl_tcp_loom), and
# a check that a downstream crate's own --cfg loom leaves rdapl whole. The
# conformance suite of providers (crates/rdapl-conformance) runs, within
# cargo test, on the loopback provider
# (crates/rdapl-loopback/tests/conformance.rs), on the asynchronous test
# provider "pipe" (rdapl-conformance's own tests/pipe.rs; written with the
# public provider interface alone) and on the TCP/iWARP provider over
# 127.0.0.1 three ways (crates/rdapl-tcp/tests/: conformance.rs with its
# defaults, conformance_sent.rs with complete=sent, conformance_small.rs
# with FPDUs of at most 100 bytes and no CRC); all but the first skip,
# with a printed reason, what only the loopback does.
#
# The kernel soft-iWARP interoperability test (crates/rdapl-cli/tests/siw.rs)
# boots the lab VM (lab/vm/, built by its build.sh; .ci/run builds it) once
# and runs rdapl rping against rping both ways, with CRC off and on.
#
# Miri (scripts/miri.sh) runs the tests of the unsafe code (the EVD ring,
# region memory, borrowed LMRs) when a nightly toolchain with Miri is
# there, and says why it skipped otherwise (a failure with
# RDAPL_REQUIRE_MIRI=1, which .ci/run sets once it installed Miri).
#
# Tests that need an outside program skip with a printed reason unless
# RDAPL_REQUIRE_EXTERNAL=1 (set by .ci/run), which turns a skip into a failure.
#
# The tcp provider's defaults can come from the environment
# (RDAPL_TCP_PARAMS, as an application's would); the tests assume the
# built-in ones (a CRC, "placed" completions, the socket's MSS) where they
# do not set their own, so a value left in the caller's shell is dropped
# here. Other settings run as conformance binaries of their own (above),
# and the whole tcp crate's tests run once more under
# RDAPL_TCP_PARAMS="complete=sent crc=0 mss=700", each test pinning in its
# own parameters what it assumes. The rdapl processes that the CLI's tests
# and the benchmarks start drop the variable (their settings are their
# --params).
set -euo pipefail
cd "$(dirname "$0")/.."
unset RDAPL_TCP_PARAMS

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo doc (workspace, warnings denied: no broken or private intra-doc link)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

echo "== cargo test (workspace, all features; the conformance suite on loopback, pipe and tcp)"
cargo test --workspace --all-features

echo "== the tcp provider's conformance and many-connection tests as an ordinary user (nobody, open files 1024:4096)"
# Run as root (CI), the step above cannot see what needs root: a TCP port
# below 1024, a descriptor limit only root has. As another user it just
# ran as one, and this step has nothing to add.
if [ "$(id -u)" = "0" ] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
  dir="$(mktemp -d)"
  chmod 755 "$dir"
  for t in conformance many; do
    exe="$(cargo test -q -p rdapl-tcp --test "$t" --no-run --message-format=json 2>/dev/null |
      grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | tail -1)"
    cp "$exe" "$dir/$t"
    chmod 755 "$dir/$t"
    (cd "$dir" && prlimit --nofile=1024:4096 \
      setpriv --reuid=65534 --regid=65534 --clear-groups -- "./$t" -q)
  done
  rm -rf "$dir"
else
  echo "(not root, or no setpriv/prlimit: nothing to add)"
fi

# The tcp provider's tests once more under settings other than its
# defaults, from the environment as an application's would come: each test
# pins in its own parameters what it assumes (placed completions, a CRC,
# the socket's MSS), so the rest check those paths under these settings.
tcp_other="complete=sent crc=0 mss=700"
echo "== the tcp provider's tests under RDAPL_TCP_PARAMS=\"$tcp_other\""
RDAPL_TCP_PARAMS="$tcp_other" cargo test -q -p rdapl-tcp --all-features

echo "== loom models (LOOM_MAX_PREEMPTIONS=${LOOM_MAX_PREEMPTIONS:-3}, warnings denied)"
LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-3}" RUSTFLAGS="--cfg rdapl_loom -D warnings" \
  CARGO_TARGET_DIR=target/loom \
  cargo test -p rdapl-core --lib --test loom_evd --release

echo "== loom models of the object model on the loopback (receive queue, teardown gate, end of a connection; every interleaving)"
RUSTFLAGS="--cfg rdapl_loom -D warnings" \
  CARGO_TARGET_DIR=target/loom \
  cargo test -p rdapl-loopback --test loom_ep --release

echo "== loom models of the tcp provider's connection lock (kicks never lost; LOOM_MAX_PREEMPTIONS=${LOOM_TCP_MAX_PREEMPTIONS:-4})"
LOOM_MAX_PREEMPTIONS="${LOOM_TCP_MAX_PREEMPTIONS:-4}" RUSTFLAGS="--cfg rdapl_tcp_loom -D warnings" \
  CARGO_TARGET_DIR=target/loom-tcp \
  cargo test -p rdapl-tcp --lib --release progress::kick

echo "== a downstream crate built with --cfg loom still sees the whole object model"
RUSTFLAGS="--cfg loom -D warnings" CARGO_TARGET_DIR=target/downstream-loom \
  cargo check -p rdapl-cli

echo "== Miri over the tests of the unsafe code (nightly; skips with a printed reason without it)"
./scripts/miri.sh
