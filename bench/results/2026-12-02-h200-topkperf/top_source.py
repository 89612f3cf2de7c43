#!/usr/bin/env python3
# Reads ncu's `--page source --csv --print-source sass` output on stdin and
# prints the N SASS lines with the most warp-stall samples, plus the
# totals, compactly. Usage: top_source.py N
import csv, sys
n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
rows = list(csv.reader(sys.stdin))
hdr_i = None
for i, r in enumerate(rows):
    if any("Warp Stall Sampling (All Samples)" in c for c in r):
        hdr_i = i
        break
if hdr_i is None:
    print("top_source: no 'Warp Stall Sampling (All Samples)' column; first lines:")
    for r in rows[:5]:
        print("  ", ",".join(r)[:300])
    sys.exit(0)
hdr = rows[hdr_i]
body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
col = {h: j for j, h in enumerate(hdr)}
def num(r, name):
    j = col.get(name)
    if j is None:
        return 0.0
    try:
        return float(r[j].replace(",", ""))
    except ValueError:
        return 0.0
S = "Warp Stall Sampling (All Samples)"
tot = sum(num(r, S) for r in body)
print(f"source lines {len(body)}, stall samples {tot:.0f}; columns: {'|'.join(hdr)[:400]}")
src = col.get("Source", 1)
addr = col.get("# Address", col.get("Address", 0))
keep = [h for h in hdr if h in ("Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)", "Instructions Executed", "L1 Wavefronts Shared Excessive", "L2 Theoretical Sectors Global Excessive")]
# opcode totals by samples
ops = {}
for r in body:
    op = r[src].split()[0] if r[src].split() else "?"
    if op.startswith("@"):
        op = r[src].split()[1] if len(r[src].split()) > 1 else op
    op = op.split(".")[0]
    ops[op] = ops.get(op, 0) + num(r, S)
print("stall samples by opcode: " + ", ".join(f"{k} {v/tot*100:.1f}%" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:16]) if tot else "")
for r in sorted(body, key=lambda r: -num(r, S))[:n]:
    print(f"  {r[addr]:>6} {num(r, S)/max(tot,1)*100:5.1f}% " + " ".join(f"{h.split('(')[0][:14]}={r[col[h]]}" for h in keep[1:]) + f"  {r[src][:90]}")
