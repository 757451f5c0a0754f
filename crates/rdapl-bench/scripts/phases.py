#!/usr/bin/env python3
"""Groups the output of `examples/alternate.rs` by the machine's phase.

Usage: phases.py FILE...

Each line is `peer method peer` (median half round trips, ns, of one
piece). A piece goes to the group its two peer runs both fall in: fast
(peer under 110 ns), mid (110-300 ns), slow (300 ns and up); pieces whose
peer changed group, or that recorded nothing (NaN), are left out. Prints
per file and group: pieces, median ratio method / mean of the two peers,
and the method's median half round trip.
"""
import math
import statistics
import sys

GROUPS = (("fast", 0, 110), ("mid", 110, 300), ("slow", 300, math.inf))


def main(paths):
    for path in paths:
        rows = []
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 3:
                    continue
                try:
                    a, x, b = map(float, parts)
                except ValueError:
                    continue
                if all(math.isfinite(v) for v in (a, x, b)):
                    rows.append((a, x, b))
        out = []
        for name, lo, hi in GROUPS:
            sel = [(a, x, b) for a, x, b in rows if lo <= min(a, b) and max(a, b) < hi]
            if sel:
                ratio = statistics.median(x / ((a + b) / 2) for a, x, b in sel)
                ns = statistics.median(x for _, x, _ in sel)
                out.append(f"{name}: {len(sel)} pieces, ratio {ratio:.2f}, {ns:.0f} ns")
        print(f"{path}: " + (" | ".join(out) if out else "no complete pieces"))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
