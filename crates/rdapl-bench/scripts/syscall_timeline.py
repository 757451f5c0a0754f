#!/usr/bin/env python3
"""Where a ping-pong's one-way time goes, system call by system call.

Usage: syscall_timeline.py FILE

FILE is `perf script --ns -F comm,pid,tid,time,event,trace` output of a
recording with syscall tracepoints: the entry and exit of `sendmsg` and
`sendto`, and the exits of `recvfrom` and `readv` (recorded with a
filter that drops `EAGAIN`; `syscall_timeline.sh` records so). Only the
main threads of processes that write with `sendmsg` or `sendto` count
(not, say, a pipe's reader); `read` is left out (fi_pingpong reads an
eventfd with it).

A process's *answer* is the run of writes it makes after it last read
data. Per answer: the first write's time in the kernel, the time between
its first and second write (user-space work between them: framing and
summing what follows), the second write's time, and the *turnaround*,
from the exit of its last read that returned data to the entry of its
first write (the receiver's work between the end of the peer's message
and its reply). Prints the median, 10th and 90th percentile of each over
every answer of every process. And the *delivery*: from the exit of a
process's first write of an answer to the exit of the peer's first read
that returned data after it (the kernel's delivery plus how soon the
peer's polling found the data; answers whose peer read data before that
write returned, a large message read while it is written, are left out).
"""
import re
import statistics
import sys

LINE = re.compile(
    r"\s*(\S+)\s+(\d+)/(\d+)\s+([\d.]+):\s+syscalls:sys_(enter|exit)_(\w+):\s*(.*)"
)
WRITES = ("sendmsg", "sendto")
READS = ("recvfrom", "readv")


def parse(path):
    """Per main thread: (time µs, 'enter'|'exit', call, return value)."""
    per = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line)
            if not m:
                continue
            comm, pid, tid, t, edge, call, rest = m.groups()
            if comm.startswith("perf") or pid != tid:
                continue
            ret = None
            if edge == "exit":
                v = int(rest.strip(), 16)
                ret = v - (1 << 64) if v >= 1 << 63 else v
            per.setdefault(pid, []).append((float(t) * 1e6, edge, call, ret))
    return {p: e for p, e in per.items() if any(x[2] in WRITES for x in e)}


def data_read(edge, call, ret):
    """The exit of a read that returned data."""
    return call in READS and edge == "exit" and ret is not None and ret > 0


def answers(events):
    """Each answer: (turnaround, [(enter, exit) of its writes]). Sorts
    `events`."""
    events.sort()
    out = []
    last_read = None
    current = None
    entered = None
    for t, edge, call, ret in events:
        if data_read(edge, call, ret):
            last_read = t
            current = None
        elif call in WRITES and edge == "enter":
            entered = t
        elif call in WRITES and edge == "exit" and entered is not None:
            if current is None and last_read is not None:
                current = (entered - last_read, [])
                out.append(current)
            if current is not None:
                current[1].append((entered, t))
            entered = None
    return out


def summary(name, values):
    if not values:
        return
    v = sorted(values)
    print(
        f"{name:<22} n={len(v):6}  median {statistics.median(v):7.2f} µs"
        f"  p10 {v[len(v) // 10]:7.2f}  p90 {v[len(v) * 9 // 10]:7.2f}"
    )


def first_reads(events):
    """Exit times of the first read that returned data after each write."""
    out = []
    wrote = False
    for t, edge, call, ret in events:
        if call in WRITES and edge == "exit":
            wrote = True
        elif wrote and data_read(edge, call, ret):
            out.append(t)
            wrote = False
    return out


def main(path):
    cols = {
        "first write": [],
        "between writes": [],
        "second write": [],
        "turnaround": [],
        "delivery": [],
    }
    per = parse(path)
    firsts = {}
    for pid, events in per.items():
        firsts[pid] = []
        for turn, writes in answers(events):
            firsts[pid].append(writes[0])
            cols["turnaround"].append(turn)
            cols["first write"].append(writes[0][1] - writes[0][0])
            if len(writes) > 1:
                cols["between writes"].append(writes[1][0] - writes[0][1])
                cols["second write"].append(writes[1][1] - writes[1][0])
    if len(per) == 2:
        a, b = per
        for src, dst in ((a, b), (b, a)):
            reads = first_reads(per[dst])
            replies = [enter for enter, _ in firsts[dst]]
            i = j = 0
            for _, w in firsts[src]:
                while i < len(reads) and reads[i] <= w:
                    i += 1
                while j < len(replies) and replies[j] <= w:
                    j += 1
                if i == len(reads):
                    break
                # The peer's first read after this write returned counts
                # only if it came before the peer's reply (else the peer
                # had read this answer while it was being written, and the
                # read found is of a later one).
                if j == len(replies) or reads[i] < replies[j]:
                    cols["delivery"].append(reads[i] - w)
    answered = len(cols["turnaround"])
    for name, values in cols.items():
        if name in ("between writes", "second write") and len(values) * 10 < answered:
            # Set-up messages and strays: not the ping-pong's shape.
            if name == "between writes":
                print(f"(one write an answer: {len(values)} of {answered} had a second)")
            continue
        summary(name, values)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
