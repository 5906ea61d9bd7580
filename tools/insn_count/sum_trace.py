#!/usr/bin/env python3
"""Instructions executed, from a qemu-aarch64 log written with `-d in_asm,exec,nochain`: each
translated block's instruction count (from its in_asm listing) added up every time a Trace line
says it ran. With -dfilter the log holds only the blocks inside the given address ranges.
   sum_trace.py LOG"""
import re
import sys

size, total, pc, cur = {}, 0, None, 0
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("IN:"):
        pc, cur = None, 0
    elif re.match(r"0x[0-9a-f]+:\s", line):
        if pc is None:
            pc = int(line.split(":")[0], 16)
        cur += 1
        size[pc] = cur
    elif line.startswith("Trace"):
        total += size.get(int(line.split("/")[1], 16), 0)
print(total)
