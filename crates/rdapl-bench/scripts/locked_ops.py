#!/usr/bin/env python3
"""Locked instructions per message of the loopback ping-pong's software path.

Usage (from the workspace root, after `cargo build --release -p rdapl-bench
--examples`):

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.out \
        target/release/examples/profile_loopback serial-rdapl 3
    python3 crates/rdapl-bench/scripts/locked_ops.py cg.out \
        target/release/examples/profile_loopback

Prints the `lock`-prefixed (and `xchg`, implicitly locked) instructions
executed per message, in total and per instruction with the function it
belongs to. A message is one call of the loopback provider's `send_fast`.
Needs `objdump` (binutils).
"""

import collections
import re
import signal
import subprocess
import sys


def locked_addresses(binary):
    """Address -> instruction text of every locked instruction in `binary`."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", binary],
        check=True, capture_output=True, text=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+((?:lock\s|xchg).*)", line)
        if m:
            found[int(m.group(1), 16)] = " ".join(m.group(2).split())
    return found


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    profile, binary = sys.argv[1], sys.argv[2]
    locks = locked_addresses(binary)
    names, counts, calls = {}, collections.Counter(), collections.Counter()
    fn, cfn, pos, skip = None, None, [0, 0], False

    def position(tok, i):
        # Callgrind compresses positions: "+n"/"-n" relative, "*" same.
        if tok == "*":
            return pos[i]
        base = 16 if tok.lstrip("+-").startswith("0x") else 10
        if tok[0] in "+-":
            pos[i] += int(tok, base) if base == 10 else int(tok[0] + str(int(tok[1:], 16)))
        else:
            pos[i] = int(tok, base)
        return pos[i]

    with open(profile) as f:
        for line in f:
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3).strip()
                if m.group(1) == "fn":
                    fn = names.get(m.group(2))
                else:
                    cfn = names.get(m.group(2))
                continue
            if line.startswith("calls="):
                if cfn and cfn.endswith("loopback::send_fast"):
                    calls[cfn] += int(line.split()[0][6:])
                skip = True
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            toks = line.split()
            addr = position(toks[0], 0)
            if len(toks) > 1:
                position(toks[1], 1)
            if skip:  # the cost line of a call: inclusive, not this instruction's
                skip = False
                continue
            if addr in locks and len(toks) > 2:
                counts[(addr, locks[addr], fn)] += int(toks[2])
    msgs = sum(calls.values())
    if msgs == 0:
        sys.exit("no call of send_fast in the profile (was it `serial-rdapl`?)")
    print(f"messages: {msgs}, locked instructions per message: "
          f"{sum(counts.values()) / msgs:.2f}")
    for (addr, text, name), n in counts.most_common():
        if n / msgs >= 0.01:
            print(f"{n / msgs:6.2f}  {addr:#x}  {text:40}  {name}")


if __name__ == "__main__":
    # Quiet when piped into `head`.
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    main()
