#!/usr/bin/env python3
"""Converts PyTorch trace CSVs (DESIGN.md format) into cachalot op lists.

An op list is what every contender of the GPU benchmark replays, so all of them
see exactly the same sequence. Text, one op a line:

    # cachalot ops v1 <trace name>
    a <id> <size> <stream>     allocate <size> requested bytes on stream index <stream>
    f <id>                     free allocation <id>

Ids are dense from 0. Stream index 0 is the device's default stream; other
indices are the recording's other streams, in order of first use. Frees happen
at free_completed (or at free_requested when no completion follows before the
address is reused or the trace ends); whatever is still live at the end is freed
at the end, so each pass of a replay starts and ends with nothing allocated.

Usage: trace-to-ops.py OUT_DIR TRACE.csv[.gz]...
"""
import csv
import gzip
import os
import sys


def convert(path):
    opener = gzip.open if path.endswith(".gz") else open
    ops, live, streams = [], {}, {"0": 0}
    next_id = 0

    def free(addr):
        ops.append(("f", live.pop(addr)))

    with opener(path, "rt", newline="") as fh:
        for row in csv.DictReader(fh):
            action, addr = row["action"], row["addr"]
            if action == "alloc":
                if addr in live:  # freed without completion: free before reuse
                    free(addr)
                stream = streams.setdefault(row["stream"], len(streams))
                live[addr] = next_id
                ops.append(("a", next_id, int(row["size"]), stream))
                next_id += 1
            elif action == "free_completed" and addr in live:
                free(addr)
    for addr in list(live):
        free(addr)
    return ops


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    for path in sys.argv[2:]:
        name = os.path.basename(path).split(".")[0]
        ops = convert(path)
        dest = os.path.join(out_dir, name + ".ops")
        with open(dest, "w") as out:
            out.write(f"# cachalot ops v1 {name}\n")
            for op in ops:
                out.write(" ".join(str(x) for x in op) + "\n")
        allocs = sum(1 for op in ops if op[0] == "a")
        print(f"{dest}: {len(ops)} ops, {allocs} allocations")


if __name__ == "__main__":
    main()
