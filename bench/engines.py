#!/usr/bin/env python3
"""The serving engines' own DSv4 prologue kernels, timed beside ours in the same device call.

The engines' kernels are built from their public source by a plugin that is not part of this
repository (their code, and any recipe that builds it, stays out of it): PLUGIN.py, given on the
command line, defines

  engines(device) -> [engine]   each with
      name        what BENCHMARKS.md calls it, e.g. "SGLang fused_q_norm_rope + fused_k_norm_rope_flashmla"
      source      where the code came from (repository, commit, files)
      q_format    "bf16" or "fp8": what it writes for Q
      kv_format   the cache format it writes ("fp8_ue8m0": the FlashMLA layout of DESIGN.md section 3)
      kv_norm     True when its launches include the KV RMSNorm (the whole KV job)
      kv_weight_bf16  (optional) True when it takes the norm weight in bf16: the equal-work check
                  then holds its KV to the eager PyTorch peer run with the weight rounded to bf16
      note        what its launches do, in a sentence
      prepare(layer) -> {"layer": fn, "kernels": {"kv": fn, "q": fn}, "q_out": tensor}
          layer: fused (T, q_lora_rank + 512) bf16 (the latent is fused[:, q_lora_rank:]), q (T, H,
          512) bf16, w (512,) float32, cos_sin (positions, 32, 2) float32 (cos, sin of GPT-J pair k),
          positions (T,) int64, slots (T,) int64, cache (pages, page_bytes) uint8, page_size, heads,
          q_lora_rank, eps. prepare may allocate what its launches read in the engine's own layouts
          (tables, outputs); only the returned closures run in the timed graphs. fn() issues the
          launches on the current stream; "layer" is every launch of one layer's prologue, in order,
          and "kernels" each of them alone under a name; q_out is the engine's Q output, (T, H, 512)
          in q_format.
  build_log() -> str             (optional) what the build printed

Each shape is timed as cmd/bench's layer graph and bench/peers.py's: every layer its own inputs,
cache and outputs (cycling over fewer sets when memory is short), all layers captured in one CUDA
graph, the L2 flushed before each replay, median; per layer = total / layers. Each kernel alone is
timed the same way, and the b=32 MTP 3 iteration also as a graph replayed back to back without the
flush (cmd/bench's iteration form). Equal work: on every case of `cmd/bench --check-dir DIR` whose
formats the engine writes, its output is held to ours with bench/check_peers.py's rule.

  python3 bench/engines.py --peers PLUGIN.py --out engines.json [--check-dir DIR]
                           [--ours bench-go.json] [--markdown engines.md]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib.util
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_peers  # noqa: E402
import peers  # noqa: E402

CTX_SEQ_TOKENS = 2048  # cmd/bench lays a context batch out in sequences of at most this many tokens


def load_plugin(path):
    spec = importlib.util.spec_from_file_location("engine_plugin", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--peers {path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "engines"):
        raise SystemExit(f"--peers {path}: defines no engines(device)")
    return mod


def shapes(args):
    out = []
    for b in args.gen_batches:
        for m in args.mtp:
            out.append(("generation", b, m, b * (1 + m)))
    for t in args.ctx_tokens:
        out.append(("context", max(1, -(-t // CTX_SEQ_TOKENS)), 0, t))
    return out


class Timer:
    def __init__(self, args, device):
        self.args = args
        self.device = device
        self.flush = torch.empty(int(3 * args.l2_mb * 1e6) // 4, dtype=torch.int32, device=device)

    def replays(self, body, flush):
        """Median microseconds of one replay of a CUDA graph holding body() (peers.graph_time),
        the replays queued back to back as cmd/bench's timeGraph does; with flush, the L2 is
        flushed (a memset of 3x its size) before each."""
        n = self.args.graph_reps
        return peers.graph_time(body, dict(min_reps=n, max_reps=n, target_s=0.0),
                                self.flush if flush else None, idle_start=False)


def layer_inputs(model, phase, batch, mtp, T, sets, page_size, device):
    """sets input sets of one shape, as bench/peers.py draws them: random bf16 rows whose
    magnitude varies by row and by 64 values, generation positions near the ends of random lengths
    up to 4096, context sequences from position 0, pages in random order."""
    dims = peers.MODELS[model]
    H, qlr = dims["heads"], dims["q_lora_rank"]
    n_pages = peers.pool_pages(phase, batch, T, page_size, peers.FP8_UE8M0, 256 << 20)
    pos, slots = peers.positions_and_slots(phase, batch, mtp, T, page_size, n_pages, device)
    span = int(pos.max()) + 1
    tables = {k: peers.rope_table(k, span, device) for k in ("plain", "yarn")}
    kinds = peers.layer_rope_kinds(sets)
    pb = peers.page_bytes(peers.FP8_UE8M0, page_size)
    out = []
    for s in range(sets):
        out.append({
            "fused": peers.random_bf16((T, qlr + peers.HEAD_DIM), device),
            "q": peers.random_bf16((T, H, peers.HEAD_DIM), device),
            "w": peers.random_weight(device),
            "cos_sin": tables[kinds[s]],
            "positions": pos, "slots": slots,
            "cache": torch.zeros((n_pages, pb), dtype=torch.uint8, device=device),
            "page_size": page_size, "heads": H, "q_lora_rank": qlr, "eps": peers.EPS,
        })
    return out


def set_bytes(model, T, heads_padded=None):
    dims = peers.MODELS[model]
    H = heads_padded or dims["heads"]
    # fused rows, Q in, the engine's Q output (bf16), a normalized latent (the pool is added by the caller)
    return T * (dims["q_lora_rank"] + peers.HEAD_DIM) * 2 + T * H * peers.HEAD_DIM * 2 * 2 + T * peers.HEAD_DIM * 2


def time_shape(timer, engine, model, phase, batch, mtp, T, args):
    dims = peers.MODELS[model]
    layers = dims["layers"] if phase == "generation" else args.ctx_layers
    per_set = set_bytes(model, T) + (256 << 20)
    sets = max(1, min(layers, int(args.graph_mem_gb * 1e9 // per_set)))
    entry = {"engine": engine.name, "model": model, "phase": phase, "batch": batch, "mtp": mtp,
             "tokens": T, "layers": layers, "sets": sets, "q_format": engine.q_format,
             "cache_format": engine.kv_format, "errors": {}}
    inputs = layer_inputs(model, phase, batch, mtp, T, sets, args.page_size, timer.device)
    prepared = [engine.prepare(x) for x in inputs]
    torch.cuda.synchronize()

    def body_of(pick):
        fns = [pick(prepared[l % sets]) for l in range(layers)]

        def body():
            for fn in fns:
                fn()
        return body

    forms = [("total_us", lambda p: p["layer"], True)]
    for k in sorted(prepared[0].get("kernels", {})):
        forms.append((f"{k}_total_us", lambda p, k=k: p["kernels"][k], True))
    if phase == "generation" and batch == args.iter_batch and mtp == args.iter_mtp:
        forms.append(("back_to_back_total_us", lambda p: p["layer"], False))
    for field, pick, flush in forms:
        try:
            entry[field] = round(timer.replays(body_of(pick), flush), 2)
            per = field.replace("total_us", "us_per_layer")
            entry[per] = round(entry[field] / layers, 3)
        except Exception as e:  # one failed form is recorded; the others still run
            entry["errors"][field] = f"{type(e).__name__}: {e}"[:600]
            if args.verbose:
                traceback.print_exc()
    del prepared, inputs
    torch.cuda.empty_cache()
    return entry


def check_engine(engine, directory, device):
    """The engine on every case of DIR whose formats it writes, held to ours (check_peers' rule)."""
    rows, errors = [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.safetensors"))):
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            tensors, meta = check_peers.load_safetensors(path)
            fmt, q_format = meta["format"], meta.get("q_format", "fp8")
            check_kv = fmt == engine.kv_format and "cache_out" in tensors
            check_q = q_format == engine.q_format and "q_out" in tensors
            if not (check_kv or check_q):
                continue
            P, qlr, heads = int(meta["page_size"]), int(meta["q_lora_rank"]), int(meta["heads"])
            slots = tensors["slots"].long()
            valid = slots >= 0
            n = int(valid.sum())
            cache_in = tensors["cache_in"]
            layer = {
                "fused": tensors["fused_a"][valid].to(device).contiguous(),
                "q": tensors["q"][valid].to(device).contiguous(),
                "w": tensors["kv_weight"].to(device),
                "cos_sin": tensors["cos_sin"].to(device).contiguous(),
                "positions": tensors["positions"].long()[valid].to(device),
                "slots": slots[valid].to(device),
                "cache": cache_in.to(device).clone(),
                "page_size": P, "heads": heads, "q_lora_rank": qlr, "eps": peers.EPS,
            }
            with torch.no_grad():
                p = engine.prepare(layer)
                p["layer"]()
                torch.cuda.synchronize()
            kv_scale = check_peers._f32(meta.get("kv_scale", "1"))
            q_scale = check_peers._f32(meta.get("q_scale", "1"))
            if check_kv:
                ours, part = tensors["cache_out"], "kv"
                w = tensors["kv_weight"]
                w16 = w.to(torch.bfloat16).float()
                if getattr(engine, "kv_weight_bf16", False) and not torch.equal(w16, w):
                    # The engine takes the norm weight in bf16 (as the checkpoint stores it) and the
                    # case's float32 weight is not bf16-exact: hold it to the eager peer run with the
                    # rounded weight instead (that peer's bytes equal ours on every case, check_peers).
                    ref = cache_in.to(device).clone()
                    peers.kv_prologue(layer["fused"][:, qlr:], w16.to(device), layer["cos_sin"],
                                      layer["positions"], layer["slots"], ref, fmt, P, kv_scale)
                    ours, part = ref.cpu(), "kv (vs the eager peer with the weight in bf16)"
                ok, stats = check_peers._kv_stats(ours, layer["cache"].cpu(), cache_in, slots[valid], fmt, P,
                                                  kv_scale)
                rows.append({"engine": engine.name, "case": name, "part": part, "format": fmt, "tokens": n,
                             "ok": ok, **stats})
            if check_q:
                ours_q = tensors["q_out"][valid]
                ok, stats = check_peers._q_stats(ours_q, peers.q_bytes_of(p["q_out"]).cpu(),
                                                 q_format == "fp8", q_scale)
                rows.append({"engine": engine.name, "case": name, "part": "q", "format": q_format,
                             "tokens": n, "ok": ok, **stats})
        except Exception as e:
            errors.append({"engine": engine.name, "case": name, "error": f"{type(e).__name__}: {e}"[:600]})
    return rows, errors


def _fmt(v, spec=".2f"):
    return "n/a" if v is None else format(v, spec)


def markdown(report, ours):
    """Ours (cmd/bench's layer_graph, kernel_graph, iteration) beside each engine, per shape."""
    lines = []
    by = {}
    if ours:
        for lg in ours.get("layer_graph", []):
            by[("layer", lg["model"], lg["phase"], lg["batch"], lg["mtp"], lg["tokens"], lg["q_format"])] = lg["us_per_layer"]
        for kg in ours.get("kernel_graph", []):
            by[(kg["kernel"], kg["model"], kg["phase"], kg["batch"], kg["mtp"], kg["tokens"], kg["format"])] = kg["us_per_layer"]
    names = [e["name"] for e in report["engines"]]
    if not names:
        lines.append("No engine was built: its build log is `build_log` in the JSON.")
        return "\n".join(lines) + "\n"
    lines.append("| model | shape | tokens | ours FP8 Q | ours bf16 Q | " + " | ".join(
        f"{n} | ours bf16 Q vs it" for n in names) + " |")
    lines.append("|---" * (5 + 2 * len(names)) + "|")
    rows = {}
    for t in report["timings"]:
        rows.setdefault((t["model"], t["phase"], t["batch"], t["mtp"], t["tokens"]), {})[t["engine"]] = t
    for key in sorted(rows, key=lambda k: (k[0], k[1] != "generation", k[4], k[2])):
        model, phase, batch, mtp, T = key
        shape = f"b={batch}" + (f" MTP {mtp}" if mtp else "") if phase == "generation" else "context"
        fp8 = by.get(("layer", model, phase, batch, mtp, T, "fp8"))
        bf = by.get(("layer", model, phase, batch, mtp, T, "bf16"))
        cells = [model, shape, str(T), _fmt(fp8), _fmt(bf)]
        for n in names:
            t = rows[key].get(n)
            theirs = t.get("us_per_layer") if t else None
            cells.append(_fmt(theirs))
            cells.append(f"{theirs / bf:.2f}x" if theirs and bf else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    kernels = []  # (engine, kernel) pairs in the order met
    for t in report["timings"]:
        for f in t:
            if f.endswith("_us_per_layer") and not f.startswith("back_to_back"):
                k = (t["engine"], f[: -len("_us_per_layer")])
                if k not in kernels:
                    kernels.append(k)
    lines.append("")
    lines.append("Each kernel alone in the same graph, us a layer (ours: KV fp8_ue8m0, Q bf16):")
    lines.append("")
    lines.append("| model | shape | tokens | ours KV | ours Q bf16 | " + " | ".join(f"{n}: {k}" for n, k in kernels) + " |")
    lines.append("|---" * (5 + len(kernels)) + "|")
    for key in sorted(rows, key=lambda k: (k[0], k[1] != "generation", k[4], k[2])):
        model, phase, batch, mtp, T = key
        shape = f"b={batch}" + (f" MTP {mtp}" if mtp else "") if phase == "generation" else "context"
        cells = [model, shape, str(T), _fmt(by.get(("kv", model, phase, batch, mtp, T, "fp8_ue8m0"))),
                 _fmt(by.get(("q", model, phase, batch, mtp, T, "bf16")))]
        for n, k in kernels:
            cells.append(_fmt((rows[key].get(n) or {}).get(f"{k}_us_per_layer")))
        lines.append("| " + " | ".join(cells) + " |")
    it = {i["model"]: i for i in (ours or {}).get("iteration", [])}
    btb = [t for t in report["timings"] if "back_to_back_total_us" in t]
    if btb:
        lines.append("")
        lines.append("The b=32 MTP 3 decode iteration, the graph replayed back to back (us; ours FP8 Q):")
        lines.append("")
        lines.append("| model | engine | theirs | ours plain graph | ours header-driven graph |")
        lines.append("|---|---|---|---|---|")
        for t in btb:
            o = it.get(t["model"], {})
            lines.append(f"| {t['model']} | {t['engine']} | {_fmt(t['back_to_back_total_us'], '.1f')} | "
                         f"{_fmt(o.get('graph_us'), '.1f')} | {_fmt(o.get('header_graph_us'), '.1f')} |")
    if report["checks"]:
        lines.append("")
        lines.append("| engine | case | part | values | failed | max err (quanta) | bytes equal | scales | untouched bytes | result |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for r in report["checks"]:
            scales = "n/a" if "scales_ok" not in r else ("ok" if r["scales_ok"] else "FAIL")
            untouched = "n/a" if "peer_untouched_ok" not in r else ("ok" if r["peer_untouched_ok"] else "CHANGED")
            lines.append(f"| {r['engine']} | {r['case']} | {r['part']} | {r['values']} | {r['failed']} | "
                         f"{r['max_err_quanta']:.0f} | {100 * r['bytes_equal']:.3f}% | {scales} | {untouched} | "
                         f"{'pass' if r['ok'] else 'FAIL'} |")
    for e in report["check_errors"]:
        lines.append(f"- check {e['engine']} {e['case']}: {e['error']}")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--peers", required=True, help="the plugin that builds the engines' kernels")
    p.add_argument("--out", default="engines.json")
    p.add_argument("--check-dir", default="", help="cmd/bench --check-dir cases to hold the engines to")
    p.add_argument("--ours", default="", help="cmd/bench's JSON of the same call, for --markdown")
    p.add_argument("--markdown", default="")
    p.add_argument("--models", default="flash,pro")
    p.add_argument("--gen-batches", default="1,8,32,256")
    p.add_argument("--mtp", default="0,3")
    p.add_argument("--ctx-tokens", default="4096,16384,65536")
    p.add_argument("--ctx-layers", type=int, default=8, help="layers in a context shape's graph (cmd/bench's)")
    p.add_argument("--iter-batch", type=int, default=32)
    p.add_argument("--iter-mtp", type=int, default=3)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--graph-reps", type=int, default=30)
    p.add_argument("--graph-mem-gb", type=float, default=40.0)
    p.add_argument("--l2-mb", type=float, default=60.0)
    p.add_argument("--budget-s", type=float, default=150.0, help="past this, the remaining shapes are skipped")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    a.models = peers._names(a.models, tuple(peers.MODELS), "models")
    a.gen_batches = peers._ints(a.gen_batches)
    a.mtp = peers._ints(a.mtp)
    a.ctx_tokens = peers._ints(a.ctx_tokens) if a.ctx_tokens not in ("", "none") else []
    return a


def main(argv=None):
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("engines.py needs a CUDA device")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    device = torch.device("cuda")
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    log(f"seed {seed}; loading {args.peers}")
    plugin = load_plugin(args.peers)
    engines = plugin.engines(device)
    report = {"device": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": " ".join(sys.argv), "seed": seed, "torch": torch.__version__,
              "engines": [{"name": e.name, "source": e.source, "q_format": e.q_format, "kv_format": e.kv_format,
                           "kv_norm": e.kv_norm, "note": e.note} for e in engines],
              "build_log": plugin.build_log() if hasattr(plugin, "build_log") else "",
              "timings": [], "checks": [], "check_errors": [], "skipped": []}

    def write():
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)

    for e in engines:
        log(f"engine {e.name}: {e.note} ({e.source})")
    if args.check_dir:
        for e in engines:
            rows, errors = check_engine(e, args.check_dir, device)
            report["checks"] += rows
            report["check_errors"] += errors
            for r in rows:
                log(f"check {e.name} {r['case']} {r['part']}: {'pass' if r['ok'] else 'FAIL'} "
                    f"(failed {r['failed']} of {r['values']}, max {r['max_err_quanta']:.1f} quanta, "
                    f"bytes equal {100 * r['bytes_equal']:.3f}%)")
            for x in errors:
                log(f"check {e.name} {x['case']}: ERROR {x['error']}")
        write()
    timer = Timer(args, device)
    order = shapes(args)
    # The iteration's shape first (issue 11's comparison), then the rest, each for every model.
    order.sort(key=lambda s: (s[0], s[1], s[2]) != ("generation", args.iter_batch, args.iter_mtp))
    for phase, batch, mtp, T in order:
        for model in args.models:
            for e in engines:
                label = f"{e.name} {model} {phase} b={batch} mtp={mtp} T={T}"
                if time.perf_counter() - t0 > args.budget_s:
                    report["skipped"].append(label)
                    continue
                try:
                    entry = time_shape(timer, e, model, phase, batch, mtp, T, args)
                except Exception as ex:
                    entry = {"engine": e.name, "model": model, "phase": phase, "batch": batch, "mtp": mtp,
                             "tokens": T, "errors": {"shape": f"{type(ex).__name__}: {ex}"[:600]}}
                    if args.verbose:
                        traceback.print_exc()
                    torch.cuda.empty_cache()
                report["timings"].append(entry)
                log(f"{label}: {_fmt(entry.get('us_per_layer'))} us a layer (kv {_fmt(entry.get('kv_us_per_layer'))}, "
                    f"q {_fmt(entry.get('q_us_per_layer'))}; back to back {_fmt(entry.get('back_to_back_total_us'))} us)"
                    + (f" errors {entry['errors']}" if entry.get("errors") else ""))
                write()
    if report["skipped"]:
        log(f"skipped past --budget-s {args.budget_s}: {len(report['skipped'])} entries")
    write()
    if args.markdown:
        ours = None
        if args.ours and os.path.exists(args.ours):
            with open(args.ours) as f:
                ours = json.load(f)
        with open(args.markdown, "w") as f:
            f.write(markdown(report, ours))
    failed = [r for r in report["checks"] if not r["ok"]] + report["check_errors"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
