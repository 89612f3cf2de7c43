"""run.sh's last step (not committed): merges engines-*.json into engines.json (+ engines.md through
bench/engines.py's markdown, when torch imports) and prints the short summary: which engines built,
the equal-work check, ours vs each engine per shape (us a layer, the layer graph, L2 flushed)."""

import argparse
import glob
import json
import os
import re
import sys

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ours", required=True)
p.add_argument("--build", required=True)
p.add_argument("--steps", default="")
a = p.parse_args()


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # missing, or cut mid-write by a kill
        print(f"({path}: {type(e).__name__}: {e})")
        return None


def log_text(name):
    try:
        with open(os.path.join(a.build, name + ".log")) as f:
            return f.read()
    except OSError:
        return ""


print("==== builds")
for e in ("sglang", "vllm"):
    text = log_text(e)
    status = re.findall(rf"^{e}: build (ok|FAILED.*?) in ([0-9.]+) s$", text, re.M)
    print(f"{e}: {' '.join(status[-1]) if status else 'no result (killed, or never started)'}")
    if not status or status[-1][0] != "ok":
        errs = [l for l in text.splitlines() if "error" in l.lower() or "killed" in l or "Error" in l]
        for l in (errs or text.splitlines())[:12]:
            print("   ", l[:300])
load_log = log_text("load")
for l in load_log.splitlines():
    print("load:", l[:300])

reports = [r for r in (load(x) for x in sorted(glob.glob(os.path.join(a.out, "engines-*.json")))) if r]
merged = None
for r in reports:
    if merged is None:
        merged = dict(r, engines=[], timings=[], checks=[], check_errors=[], skipped=[], parts=[])
    merged["engines"] += r.get("engines", [])
    for k in ("timings", "checks", "check_errors", "skipped"):
        merged[k] += r.get(k, [])
    merged["parts"].append({"command": r.get("command"), "seed": r.get("seed"), "date": r.get("date")})
if merged is not None:
    merged["build_log"] = "\n".join(f"==== {n}\n{log_text(n)[-15000:]}" for n in ("sglang", "vllm", "load"))
    with open(os.path.join(a.out, "engines.json"), "w") as f:
        json.dump(merged, f, indent=1)
ours = load(a.ours) or {}

print("\n==== ours (cmd/bench)")
print(f"layer_graph entries {len(ours.get('layer_graph', []))}, kernel_graph {len(ours.get('kernel_graph', []))}, "
      f"iteration {len(ours.get('iteration', []))}, checks {len(ours.get('checks', []))}, errors {ours.get('errors')}")
for c in ours.get("checks", []):
    print("  ", c)

if merged is None:
    print("\nno engines report")
    sys.exit(0)

print("\n==== engines loaded:", ", ".join(e["name"] for e in merged["engines"]) or "none")
print("\n==== equal-work check (bench/check_peers.py's rule, on ours' cases)")
by_engine = {}
for r in merged["checks"]:
    by_engine.setdefault(r["engine"], []).append(r)
for name, rows in by_engine.items():
    ok = sum(r["ok"] for r in rows)
    print(f"{name}: {ok}/{len(rows)} pass")
    for r in rows:
        print(f"   {r['case']} {r['part']}: {'pass' if r['ok'] else 'FAIL'} (failed {r['failed']} of {r['values']}, "
              f"max {r['max_err_quanta']:.1f} quanta, bytes equal {100 * r['bytes_equal']:.3f}%)")
for x in merged["check_errors"]:
    print(f"   ERROR {x['engine']} {x['case']}: {x['error'][:300]}")

lg = {(x["model"], x["phase"], x["batch"], x["mtp"], x["tokens"], x["q_format"]): x["us_per_layer"]
      for x in ours.get("layer_graph", [])}
names = [e["name"] for e in merged["engines"]]
short = {n: n.split()[0] for n in names}
rows = {}
for t in merged["timings"]:
    rows.setdefault((t["model"], t["phase"], t["batch"], t["mtp"], t["tokens"]), {})[t["engine"]] = t
print("\n==== us a layer (layer graph, L2 flushed before each replay; ratio = theirs / ours bf16 Q)")
head = f"{'model':6} {'shape':14} {'T':>6} {'ours fp8':>9} {'ours bf16':>9}"
for n in names:
    head += f" {short[n]:>9} {'x':>6}"
print(head)
for key in sorted(rows, key=lambda k: (k[0], k[1] != "generation", k[4], k[2])):
    model, phase, b, m, T = key
    shape = f"b={b} MTP {m}" if phase == "generation" else "context"
    fp8, bf = lg.get((model, phase, b, m, T, "fp8")), lg.get((model, phase, b, m, T, "bf16"))
    line = f"{model:6} {shape:14} {T:>6} {fp8 if fp8 is not None else float('nan'):9.2f} " \
           f"{bf if bf is not None else float('nan'):9.2f}"
    for n in names:
        t = rows[key].get(n) or {}
        v = t.get("us_per_layer")
        line += f" {v if v is not None else float('nan'):9.2f} " + (f"{v / bf:5.2f}x" if v and bf else "   n/a")
        if t.get("errors"):
            line += f" [errors: {'; '.join(f'{k}: {e[:80]}' for k, e in t['errors'].items())}]"
    print(line)
it = {i["model"]: i for i in ours.get("iteration", [])}
for t in merged["timings"]:
    if "back_to_back_total_us" in t:
        o = it.get(t["model"], {})
        print(f"iteration b=32 MTP 3 {t['model']}: {short[t['engine']]} {t['back_to_back_total_us']:.1f} us back to back; "
              f"ours graph {o.get('graph_us', float('nan')):.1f} us (FP8 Q)")
if merged["skipped"]:
    print(f"\nskipped past --budget-s: {len(merged['skipped'])}: " + "; ".join(merged["skipped"][:8]))

# engines.md through the committed renderer (needs torch, which bench/engines.py imports)
try:
    sys.path.insert(0, "bench")
    import engines as E  # noqa: E402
    with open(os.path.join(a.out, "engines.md"), "w") as f:
        f.write(E.markdown(merged, ours))
    print("\nwrote engines.json, engines.md")
except Exception as e:
    print(f"\nwrote engines.json; engines.md not rendered: {type(e).__name__}: {e}")
