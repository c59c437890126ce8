#!/usr/bin/env python3
"""The NIF's floors, and the check that keeps them (make test-c).

Each .c file of the NIF (a unit) stands on one floor of FLOORS. A unit may
use a function or global of another unit only if that unit stands on a
lower floor, and may include another unit's header (args.h for args.c)
only then too. Shared headers (SHARED: types and inline helpers, with no
.c of their own) may be included anywhere. So the entry file is the top
floor and nothing calls upwards, as gpud/tests/layers.rs keeps gpud.

The reading is textual: comments and strings are stripped, a unit defines
the functions and globals written at column 0 without `static`, and it
uses a name of another unit where the name appears as a word. That is
enough for C written as c_src is (no function pointers passed across
units but for the copy pool's callback, which is the caller's own).

    python3 c_src/layers.py [DIR]   # exit status 1 and one line per fault
"""

import os
import re
import sys

# Bottom floor first. A unit's line lists the units it may use.
FLOORS = [
    ["atoms", "copy", "arena", "shm", "prefault", "signature", "slot_cache"],
    ["kernels"],
    ["args"],
    ["results", "submit"],
    ["pipeline"],
    ["buffers", "pinned"],
    ["complete"],
    ["launch", "device", "stats"],
    ["erlcuda_nif"],
]

# Headers with no unit of their own: what every floor shares.
SHARED = {"device_state.h", "erlcuda_ring.h", "profile.h"}


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])'", "' '", text)


DEF_FN = re.compile(r"^(?!static\b)(?!typedef\b)(?!extern\b)[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*\{", re.M)
DEF_VAR = re.compile(r"^(?!static\b)(?!typedef\b)(?!extern\b)(?!struct\b[^;]*\{)(?!enum\b)(?!return\b)"
                     r"[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*(=[^;]*)?;", re.M)


def top_level(text):
    """The text outside braces: where definitions stand."""
    out, depth = [], 0
    for ch in text:
        if ch == "{":
            depth += 1
            out.append(ch if depth == 1 else " ")
        elif ch == "}":
            depth -= 1
            out.append(ch if depth == 0 else " ")
        else:
            out.append(ch if depth == 0 else (ch if ch == "\n" else " "))
    return "".join(out)


def main(root):
    floor = {u: i for i, us in enumerate(FLOORS) for u in us}
    units = sorted(f[:-2] for f in os.listdir(root) if f.endswith(".c") and not f.endswith("_test.c"))
    faults = []
    for u in units:
        if u not in floor:
            faults.append("%s.c stands on no floor (add it to FLOORS in c_src/layers.py)" % u)
    for u in floor:
        if u not in units:
            faults.append("FLOORS names %s, which has no %s.c" % (u, u))
    headers = sorted(f for f in os.listdir(root) if f.endswith(".h"))
    for h in headers:
        if h[:-2] not in floor and h not in SHARED:
            faults.append("%s belongs to no unit and is not SHARED" % h)
    src = {u: strip(open(os.path.join(root, u + ".c")).read()) for u in units}
    owner = {}
    for u, text in src.items():
        tl = top_level(text)
        for m in DEF_FN.finditer(tl):
            owner[m.group(1)] = u
        for m in DEF_VAR.finditer(tl):
            if "(" not in m.group(0):
                owner[m.group(1)] = u
    for u, text in src.items():
        if u not in floor:
            continue
        used = {}
        for name, o in owner.items():
            if o != u and re.search(r"\b%s\b" % re.escape(name), text):
                used.setdefault(o, []).append(name)
        for o, names in sorted(used.items()):
            if o in floor and floor[o] >= floor[u]:
                faults.append("%s.c (floor %d) uses %s of %s.c (floor %d)"
                              % (u, floor[u], ", ".join(sorted(names)), o, floor[o]))
        raw = open(os.path.join(root, u + ".c")).read()
        for h in re.findall(r'^#include "([^"]+)"', raw, re.M):
            o = h[:-2]
            if h in SHARED or o == u or o not in floor:
                continue
            if floor[o] >= floor[u]:
                faults.append("%s.c (floor %d) includes %s, of floor %d" % (u, floor[u], h, floor[o]))
    for f in faults:
        print("c_src layers: " + f)
    if not faults:
        print("c_src layers: %d units on %d floors, nothing used or included from above"
              % (len(units), len(FLOORS)))
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))))
