#!/usr/bin/env python3
"""The PyTorch peer of the whole chain from hidden states (DESIGN.md section 7), and its benchmark.

One layer, the way a competent PyTorch user writes it for a serving loop on Hopper:

1. act_quant of the hidden rows in torch: per row and 128-value block the absolute maximum (at
   least 1e-4), the UE8M0 scale 2^ceil(log2(amax/448)), the e4m3 cast; the scales laid out
   (hidden/128, rows), the layout cuBLASLt's 1x128 block scaling reads;
2. the fused [wq_a; wkv] GEMM with torch._scaled_mm and block-wise scales (1x128 activations,
   128x128 weights: cuBLASLt, bf16 out);
3. the KV prologue of peers.py (make_layer_parts' kv_part: RMSNorm, RoPE, UE8M0 quantization, one
   scatter into the paged pool) on a second CUDA stream, forked after the fused GEMM;
4. q_norm (RMSNorm with its weight) and its act_quant;
5. the wq_b GEMM with torch._scaled_mm;
6. the Q prologue (q_part: per-head RMSNorm, RoPE, e4m3), then the join.

act_quant, q_norm + act_quant and both prologue halves are torch.compile'd (fullgraph,
dynamic=True: one compile per function and model for every shape); the GEMMs are the library's.
Every layer of the graph has its own weights, hidden rows, cache pool and Q output (memory
allowing), the whole iteration (the per-iteration RoPE and slot plan, then every layer) is
captured in one CUDA graph, replayed with the L2 flushed before each replay (median); time per
layer = total / layers, as cmd/bench times ours. The same graph without the KV prologue shows
what the fork leaves of it. Generation batches are padded to the graph bucket cmd/bench uses
(powers of two, at least 16 rows; cuBLASLt refuses M = 1 and 2) and the prologue runs on the real
rows; context batches are sequences of at most 2048 tokens, as cmd/bench lays them out.

Where torch._scaled_mm refuses block-wise scaling for a shape, that GEMM falls back to a bf16
matmul on weights dequantized once (x dequantized per call), and the entry says so (gemm). A
sanity check compares each GEMM's output with a float32 reference on the dequantized operands
(gemm_check: relative error of the output's maximum, on layer 0 of the first shape of each
model). No failure of one shape ends the run: it is recorded and the next one runs.

  python3 bench/chain_peer.py --out chain-peer.json   (see --help)
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers as P  # noqa: E402

# The chain's model dims (DESIGN.md section 2 and 7).
DIMS = {
    "flash": {"hidden": 4096, "heads": 64, "q_lora_rank": 1024},
    "pro": {"hidden": 7168, "heads": 128, "q_lora_rank": 1536},
}
BLOCK = 128
AMAX_FLOOR = 1e-4
# cmd/bench's layout of the shapes: generation padded to power-of-two graph buckets of at least
# MIN_BUCKET rows; context in sequences of at most CTX_CHUNK tokens.
MIN_BUCKET = 16
CTX_CHUNK = 2048
SCALED_MM = "torch._scaled_mm, block-wise scales (cuBLASLt)"


def graph_rows(tokens: int) -> int:
    """The rows a generation batch of this many tokens is padded to (cmd/bench's graphBucket)."""
    b = MIN_BUCKET
    while b < tokens:
        b *= 2
    return b


def act_quant(x: torch.Tensor):
    """(M, K) bf16 -> (M, K) e4m3 and the UE8M0 scales (K/128, M) float32 contiguous.

    Per 128-value block: a = max(max |x|, 1e-4) (NaN ignored), s = 2^ceil(log2(a/448)) read from
    the bits of a/448 (exact), e4m3(x / s) saturated."""
    xf = x.float().unflatten(-1, (-1, BLOCK))
    amax = torch.nan_to_num(xf.abs(), nan=0.0).amax(dim=-1).clamp_min(AMAX_FLOOR)
    t = amax / P.E4M3_MAX
    bits = t.view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    e = e.clamp(1, 253)  # finite inputs stay inside; keeps 2^(127-e) a normal float
    scale = (e << 23).view(torch.float32)
    inv = ((254 - e) << 23).view(torch.float32)
    q = P._to_e4m3(xf * inv.unsqueeze(-1)).flatten(-2)
    return q, scale.t().contiguous()


def make_q_norm_quant(q_lora_rank: int):
    """q_norm_quant(fused, w): RMSNorm of the first q_lora_rank values of each fused row with w
    (float32), bf16, then act_quant."""
    def q_norm_quant(fused, w):
        return act_quant(P._rms_norm(fused[:, :q_lora_rank], w))
    return q_norm_quant


def gemm_scaled(xq, xs, w, ws):
    """Y = dequant(xq) . dequant(w)^T in bf16 through torch._scaled_mm: xq (M, K) e4m3, xs (K/128,
    M) float32, w (N, K) e4m3, ws (N/128, K/128) float32. scale_a is (M, K/128) with strides (1,
    M), scale_b (K/128, N/128) with strides (1, K/128): the layouts of 1x128 and 128x128 block
    scaling (w.t() is the column-major (K, N) operand)."""
    return torch._scaled_mm(xq, w.t(), scale_a=xs.t(), scale_b=ws.t(), out_dtype=torch.bfloat16)


def dequant_acts(xq, xs):
    """float32 (M, K) of act_quant's output."""
    return (xq.float().unflatten(-1, (-1, BLOCK)) * xs.t().unsqueeze(-1)).flatten(-2)


def dequant_weight(w, ws):
    """float32 (N, K) of an e4m3 weight with 128x128 block scales (N, K multiples of 128)."""
    n, k = w.shape
    blocks = w.float().view(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    return (blocks * ws[:, None, :, None]).view(n, k)


def gemm_fallback(xq, xs, w_bf16):
    """The fallback where _scaled_mm refuses: x dequantized to bf16, a bf16 matmul on the
    weights dequantized once."""
    return dequant_acts(xq, xs).to(torch.bfloat16) @ w_bf16.t()


def rel_err(y, ref):
    """max |y - ref| / max |ref|, or None when ref is all zeros (JSON has no NaN)."""
    den = ref.abs().max().item()
    if not den > 0:
        return None
    return (y.float() - ref).abs().max().item() / den


class Step:
    """A function of the chain, compiled when asked; a compile failure is recorded and the eager
    function runs from then on."""

    def __init__(self, name, fn, compile_kwargs, log):
        self.name, self.eager, self.log = name, fn, log
        self.compiled = torch.compile(fn, **compile_kwargs) if compile_kwargs is not None else None
        self.error = None if compile_kwargs is not None else "not compiled"

    def __call__(self, *args):
        if self.compiled is not None:
            try:
                return self.compiled(*args)
            except Exception as e:
                self.error = P._error_text(e)
                self.compiled = None
                self.log(f"{self.name}: torch.compile failed, eager from now on: {self.error}")
        return self.eager(*args)


class ChainBench:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.cuda = self.device.type == "cuda"
        self.t0 = time.perf_counter()
        self.entries = []
        self.copy_gbps = None
        self.weights = {}  # model -> list of layer dicts
        self.steps = {}  # model -> {name: Step}
        self.checked = set()  # models whose GEMMs were checked
        self.gemm_paths = {}  # (model, gemm, rows) -> path text
        table_len = max([P.MAX_GEN_KV_LEN] + [t + 1 for t in args.ctx_tokens])
        self.tables = {k: P.rope_table(k, table_len, self.device) for k in ("plain", "yarn")}
        self.flush = None
        if self.cuda:
            self.flush = torch.empty(int(3 * args.l2_mb * 1e6) // 4, dtype=torch.int32, device=self.device)
            self.side = torch.cuda.Stream(device=self.device)

    def elapsed(self):
        return time.perf_counter() - self.t0

    def log(self, msg):
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)

    def write(self):
        compile_status = {f"{m}/{n}": (s.error or "ok") for m, steps in self.steps.items() for n, s in steps.items()}
        doc = {
            "device": torch.cuda.get_device_name(self.device) if self.cuda else str(self.device),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "copy_gbps": self.copy_gbps,
            "layers": self.args.layers,
            "compile": compile_status,
            "timing": "one CUDA graph of every layer, the L2 flushed before each replay, median of CUDA-event times",
            "elapsed_s": round(self.elapsed(), 1),
            "chain": self.entries,
        }
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.args.out)

    def measure_copy(self):
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        us, _ = P.time_us(lambda: dst.copy_(src), lambda i: (), None, 20, 20, 0.0)
        self.copy_gbps = round(2 * n / (us * 1e-6) / 1e9, 1)
        del src, dst
        self.log(f"device-to-device copy: {self.copy_gbps} GB/s (read + write of 1 GiB)")

    # -- the model's weights and compiled steps, made once

    def model_weights(self, model):
        if model not in self.weights:
            d = DIMS[model]
            H, Q, N = d["hidden"], d["q_lora_rank"], d["heads"] * P.HEAD_DIM
            kinds = P.layer_rope_kinds(self.args.layers)
            layers = []
            for l in range(self.args.layers):
                wf, wfs = self.random_fp8_weight(Q + P.HEAD_DIM, H)
                wqb, wqbs = self.random_fp8_weight(N, Q)
                layers.append({"wf": wf, "wfs": wfs, "wqb": wqb, "wqbs": wqbs, "kind": kinds[l],
                               "qnw": (torch.rand(Q, device=self.device) + 0.5).float(),
                               "kvw": P.random_weight(self.device)})
            self.weights[model] = layers
        return self.weights[model]

    def random_fp8_weight(self, n, k):
        w = (torch.randn(n, k, device=self.device, dtype=torch.bfloat16) * 8).to(P.FP8)
        ws = torch.rand(n // BLOCK, k // BLOCK, device=self.device) * (1.5 / 1024) + 0.5 / 1024
        return w, ws

    def model_steps(self, model):
        if model not in self.steps:
            a = self.args
            ck = None
            if not a.no_compile and self.cuda:
                ck = {"fullgraph": True, "dynamic": True}
                if a.compile_mode != "default":
                    ck["mode"] = a.compile_mode
            kv_part, q_part = P.make_layer_parts(P.FP8_UE8M0, DIMS[model]["q_lora_rank"], shift_bytes=ck is not None)
            self.steps[model] = {
                "act_quant": Step(f"{model} act_quant", act_quant, ck, self.log),
                "q_norm_quant": Step(f"{model} q_norm_quant", make_q_norm_quant(DIMS[model]["q_lora_rank"]), ck, self.log),
                "kv": Step(f"{model} kv_part", kv_part, ck, self.log),
                "q": Step(f"{model} q_part", q_part, ck, self.log),
            }
        return self.steps[model]

    def gemm_for(self, model, name, rows, xq, xs, layer):
        """The GEMM function for (model, GEMM, rows): _scaled_mm if it takes the shape (tried once,
        on layer 0's operands), else the dequantized bf16 fallback (weights dequantized once)."""
        wk, sk = ("wf", "wfs") if name == "fused" else ("wqb", "wqbs")
        key = (model, name, rows)
        if key not in self.gemm_paths:
            if not self.cuda:
                self.gemm_paths[key] = "bf16 matmul on dequantized weights (not a CUDA device)"
            else:
                try:
                    gemm_scaled(xq, xs, layer[wk], layer[sk])
                    torch.cuda.synchronize()
                    self.gemm_paths[key] = SCALED_MM
                except Exception as e:
                    self.gemm_paths[key] = "bf16 matmul on dequantized weights (_scaled_mm refused: " + P._error_text(e) + ")"
                    self.log(f"{model} {name} GEMM at {rows} rows: {self.gemm_paths[key]}")
        if self.gemm_paths[key] == SCALED_MM:
            return lambda xq_, xs_, lw: gemm_scaled(xq_, xs_, lw[wk], lw[sk])
        for lw in self.model_weights(model):
            if wk + "_bf16" not in lw:
                lw[wk + "_bf16"] = dequant_weight(lw[wk], lw[sk]).to(torch.bfloat16)
        return lambda xq_, xs_, lw: gemm_fallback(xq_, xs_, lw[wk + "_bf16"])

    # -- one shape

    def run_shape(self, model, phase, batch, mtp, tokens):
        a = self.args
        d = DIMS[model]
        Hd, heads, Q = d["hidden"], d["heads"], d["q_lora_rank"]
        T = tokens
        rows = graph_rows(T) if phase == "generation" else T
        L = a.layers
        entry = {"model": model, "phase": phase, "batch": batch, "mtp": mtp, "tokens": T, "rows": rows, "layers": L,
                 "us_per_layer": None, "no_kv_us_per_layer": None, "total_us": None, "errors": {}}
        label = f"chain {model} {phase} b={batch} mtp={mtp} T={T} rows={rows}"
        if self.elapsed() > a.budget_s:
            entry["errors"]["run"] = f"skipped: past --budget-s {a.budget_s}"
            self.log(f"{label}: skipped (budget)")
            return entry
        wb = (Q + P.HEAD_DIM) * Hd + 4 * ((Q + P.HEAD_DIM) // BLOCK) * (Hd // BLOCK) \
            + heads * P.HEAD_DIM * Q + 4 * (heads * P.HEAD_DIM // BLOCK) * (Q // BLOCK) + 4 * Q
        entry["weight_bytes"] = wb
        try:
            layers = self.model_weights(model)
            steps = self.model_steps(model)
            P_ = a.page_size
            nseq = batch
            n_pages = P.pool_pages(phase, nseq, T, P_, P.FP8_UE8M0, 0)
            pb = P.page_bytes(P.FP8_UE8M0, P_)
            pos, slots = P.positions_and_slots(phase, nseq, mtp, T, P_, n_pages, self.device)
            set_bytes = rows * Hd * 2 + n_pages * pb + T * heads * P.HEAD_DIM
            n_sets = max(1, min(L, int(a.mem_gb * 1e9) // set_bytes))
            sets = [{"hidden": P.random_bf16((rows, Hd), self.device),
                     "cache": torch.zeros(n_pages * pb, dtype=torch.uint8, device=self.device),
                     "q_out": torch.empty((T, heads, P.HEAD_DIM), dtype=P.FP8, device=self.device)}
                    for _ in range(n_sets)]
            entry["sets"] = n_sets
            # The GEMM paths, on layer 0's operands.
            xq, xs = steps["act_quant"](sets[0]["hidden"])
            gf = self.gemm_for(model, "fused", rows, xq, xs, layers[0])
            fused = gf(xq, xs, layers[0])
            qn, qs = steps["q_norm_quant"](fused, layers[0]["qnw"])
            gq = self.gemm_for(model, "wq_b", rows, qn, qs, layers[0])
            entry["gemm"] = {"fused": self.gemm_paths[(model, "fused", rows)],
                             "wq_b": self.gemm_paths[(model, "wq_b", rows)]}
            if model not in self.checked and rows <= 1024:
                self.checked.add(model)
                qin = gq(qn, qs, layers[0])
                ref_f = dequant_acts(xq, xs) @ dequant_weight(layers[0]["wf"], layers[0]["wfs"]).t()
                ref_q = dequant_acts(qn, qs) @ dequant_weight(layers[0]["wqb"], layers[0]["wqbs"]).t()
                chk = {"fused_rel_err": rel_err(fused, ref_f), "wq_b_rel_err": rel_err(qin, ref_q), "rows": rows}
                chk["ok"] = all(v is not None and v < 0.01 for v in (chk["fused_rel_err"], chk["wq_b_rel_err"]))
                entry["gemm_check"] = chk
                self.log(f"{model} GEMM check at {rows} rows: fused {chk['fused_rel_err']}, "
                         f"wq_b {chk['wq_b_rel_err']} of the output's max ({'ok' if chk['ok'] else 'FAILED'})")
                del qin, ref_f, ref_q
            del xq, xs, fused, qn, qs
        except Exception as e:
            entry["errors"]["inputs"] = P._error_text(e)
            self.log(f"{label}: inputs failed: {entry['errors']['inputs']}")
            if a.verbose:
                traceback.print_exc()
            return entry

        def make_step(with_kv):
            def step():
                plan = P.iteration_plan(pos, slots, P.FP8_UE8M0, P_, self.tables)
                vbase, sbase = plan["vbase"], plan["sbase"]
                main = torch.cuda.current_stream() if self.cuda else None
                for l, lw in enumerate(layers):
                    s = sets[l % n_sets]
                    cos, sin = plan["rope"][lw["kind"]]
                    xq, xs = steps["act_quant"](s["hidden"])
                    fused = gf(xq, xs, lw)
                    if with_kv and self.cuda:
                        # Fork: the KV prologue on the side stream, under q_norm and wq_b.
                        self.side.wait_stream(main)
                        with torch.cuda.stream(self.side):
                            steps["kv"](fused[:T], lw["kvw"], cos, sin, vbase, sbase, s["cache"])
                    elif with_kv:
                        steps["kv"](fused[:T], lw["kvw"], cos, sin, vbase, sbase, s["cache"])
                    qn, qs = steps["q_norm_quant"](fused, lw["qnw"])
                    qin = gq(qn, qs, lw)
                    steps["q"](qin[:T].view(T, heads, P.HEAD_DIM), cos, sin, s["q_out"])
                    if with_kv and self.cuda:
                        main.wait_stream(self.side)  # join before fused can be freed
            return step

        reps = dict(min_reps=a.min_reps, max_reps=a.max_reps, target_s=a.target_s)
        for field, with_kv in (("us_per_layer", True), ("no_kv_us_per_layer", False)):
            try:
                step = make_step(with_kv)
                t0 = time.perf_counter()
                total = self.graph_time(step, reps) if self.cuda else self.eager_time(step)
                if with_kv:
                    entry["total_us"] = total
                    entry["first_s"] = round(time.perf_counter() - t0, 2)  # compiles included, first shape
                entry[field] = round(total / L, 3)
            except Exception as e:
                entry["errors"][field] = P._error_text(e)
                if a.verbose:
                    traceback.print_exc()
        if entry["us_per_layer"] is not None:
            entry["weight_gbps"] = round(wb / (entry["us_per_layer"] * 1e3), 1)
            if entry["no_kv_us_per_layer"] is not None:
                entry["kv_exposed_us"] = round(entry["us_per_layer"] - entry["no_kv_us_per_layer"], 3)
        if self.copy_gbps:
            entry["weight_floor_us"] = round(wb / (self.copy_gbps * 1e3), 3)
        self.log(f"{label}: {_fmt(entry['us_per_layer'])} a layer, without KV {_fmt(entry['no_kv_us_per_layer'])} "
                 f"({n_sets} sets; GEMMs: {'scaled_mm' if entry['gemm']['fused'] == SCALED_MM else 'FALLBACK'}/"
                 f"{'scaled_mm' if entry['gemm']['wq_b'] == SCALED_MM else 'FALLBACK'})"
                 + (f" errors {entry['errors']}" if entry["errors"] else ""))
        del sets
        return entry

    def graph_time(self, body, reps):
        """body captured in one CUDA graph (peers.graph_time: warmed up, and so compiled, on a
        side stream first), replayed with the L2 flushed before each replay; median microseconds."""
        return P.graph_time(body, reps, self.flush)

    def eager_time(self, body):
        """Off CUDA (a dry run of the plumbing): one warm call, then the wall time of one."""
        body()
        t0 = time.perf_counter()
        body()
        return (time.perf_counter() - t0) * 1e6


def _fmt(v):
    return "n/a" if v is None else f"{v:.2f} us"


def _ints(text):
    return [] if text.strip() == "none" else [int(v) for v in text.split(",") if v.strip()]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="chain-peer.json", help="JSON file to write (rewritten after every shape)")
    p.add_argument("--models", default="flash,pro")
    p.add_argument("--gen-batches", default="1,8,32,128,256")
    p.add_argument("--mtp", default="0,3")
    p.add_argument("--ctx-tokens", default="1024,4096,16384", help="context batches in tokens ('none' for none)")
    p.add_argument("--layers", type=int, default=8, help="layers in the graph, each with its own weights")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--mem-gb", type=float, default=40.0, help="most memory for one shape's per-layer inputs")
    p.add_argument("--compile-mode", default="default", choices=("default", "max-autotune-no-cudagraphs"))
    p.add_argument("--no-compile", action="store_true", help="run the non-GEMM steps eagerly")
    p.add_argument("--min-reps", type=int, default=20)
    p.add_argument("--max-reps", type=int, default=100)
    p.add_argument("--target-s", type=float, default=0.2, help="aim for this much timed work per measurement")
    p.add_argument("--l2-mb", type=float, default=60.0)
    p.add_argument("--budget-s", type=float, default=150.0, help="past this, the remaining shapes are skipped")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default="cuda")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    for m in args.models:
        if m not in DIMS:
            raise SystemExit(f"--models {m!r}: want some of {', '.join(DIMS)}")
    args.gen_batches = _ints(args.gen_batches)
    args.mtp = _ints(args.mtp)
    args.ctx_tokens = _ints(args.ctx_tokens)
    if args.layers < 1:
        raise SystemExit(f"--layers {args.layers}: want at least 1")
    if args.page_size <= 0 or args.page_size & (args.page_size - 1):
        raise SystemExit(f"--page-size {args.page_size}: want a power of two")
    if any(b < 1 for b in args.gen_batches) or any(m < 0 for m in args.mtp) or any(t < 1 for t in args.ctx_tokens):
        raise SystemExit("--gen-batches, --mtp, --ctx-tokens: want positive batches and tokens, MTP >= 0")
    return args


def shapes(args):
    """(phase, batch, mtp, tokens), issue 9's goal shape (b=32 MTP 3) first, then generation by
    MTP and batch, then context (batch = sequences of at most 2048 tokens)."""
    out = [("generation", b, m, b * (1 + m)) for m in args.mtp for b in args.gen_batches]
    out.sort(key=lambda s: (s[1], s[2]) != (32, 3))
    out += [("context", -(-t // CTX_CHUNK), 0, t) for t in args.ctx_tokens]
    return out


def main(argv=None):
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("chain_peer.py needs a CUDA device (or --device cpu for a dry run)")
    if P.FP8 is None:
        raise SystemExit(f"torch {torch.__version__} has no float8_e4m3fn")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"chain peer: torch {torch.__version__}, seed {seed}", flush=True)
    torch.manual_seed(seed)
    try:
        dynamo_config = importlib.import_module("torch._dynamo").config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, 64)
    except Exception as e:
        print(f"note: could not raise dynamo's recompile limit: {P._error_text(e)}", flush=True)
    with torch.no_grad():
        bench = ChainBench(args)
        if bench.cuda:
            bench.log(f"device {torch.cuda.get_device_name(bench.device)}")
            bench.measure_copy()
        bench.write()
        for phase, batch, mtp, tokens in shapes(args):
            for model in args.models:
                try:
                    entry = bench.run_shape(model, phase, batch, mtp, tokens)
                except Exception as e:  # never lose the run to one shape
                    entry = {"model": model, "phase": phase, "batch": batch, "mtp": mtp, "tokens": tokens,
                             "us_per_layer": None, "errors": {"run": P._error_text(e)}}
                    bench.log(f"chain {model} {phase} T={tokens}: {entry['errors']['run']}")
                    if args.verbose:
                        traceback.print_exc()
                bench.entries.append(entry)
                bench.write()
                if bench.cuda:
                    torch.cuda.empty_cache()
        bench.log(f"done: {len(bench.entries)} entries -> {args.out}")
        bench.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
