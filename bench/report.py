#!/usr/bin/env python3
"""Merges our Go benchmark (bench-go.json) with the PyTorch peers (bench-peers.json) into Markdown.

  python3 bench/report.py --go bench-go.json --peers bench-peers.json [--check check.json] [--markdown FILE]

Rows are joined on (kernel, model, format, phase, batch, mtp, tokens); a context row whose batch
differs between the two runs is joined on its token count alone when that is unambiguous. A
ratio is peer time / our time: "2.50× faster" means ours takes 40% of the peer's time. Missing
peers entries print as n/a. Needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys

KERNEL_TITLES = {"kv": "KV prologue (RMSNorm + RoPE + quantize + paged store)",
                 "q": "Q prologue (RMSNorm + RoPE + FP8)"}
MODEL_TITLES = {"flash": "V4-Flash", "pro": "V4-Pro"}
FORMAT_ORDER = ["fp8_ue8m0", "bf16", "fp8_pertensor", "fp8"]
MODEL_ORDER = ["flash", "pro"]


def _key(r):
    return (str(r.get("kernel")), str(r.get("model")), str(r.get("format")), str(r.get("phase")),
            int(r.get("batch", -1)), int(r.get("mtp", 0)), int(r.get("tokens", -1)))


def _loose_key(r):
    return (str(r.get("kernel")), str(r.get("model")), str(r.get("format")), str(r.get("phase")),
            int(r.get("tokens", -1)))


def join(go_rows, peer_rows):
    """[(go_row, peer_row or None)] in Go's order."""
    exact = {_key(p): p for p in peer_rows}
    loose = {}
    for p in peer_rows:
        loose.setdefault(_loose_key(p), []).append(p)
    out = []
    for g in go_rows:
        p = exact.get(_key(g))
        if p is None and g.get("phase") == "context":
            candidates = loose.get(_loose_key(g), [])
            if len(candidates) == 1:
                p = candidates[0]
        out.append((g, p))
    return out


def ratio(peer_us, our_us):
    if not _num(peer_us) or not _num(our_us) or our_us <= 0:
        return None
    return peer_us / our_us


def fmt_ratio(r):
    if r is None:
        return "n/a"
    if r >= 1:
        return f"{r:.2f}× faster"
    return f"{r:.2f}× ({1 / r:.2f}× slower)"


def _num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def fmt_us(v):
    if not _num(v):
        return "n/a"
    if v < 10:
        return f"{v:.2f}"
    if v < 1000:
        return f"{v:.1f}"
    return f"{v:,.0f}"


def fmt_num(v, spec):
    return format(v, spec) if _num(v) else "n/a"


def peer_cell(p, field, error_field, notes):
    """A peer time, or 'n/a' / 'error [n]' with the error kept for a footnote."""
    if p is None:
        return "n/a"
    v = p.get(field)
    if _num(v):
        return fmt_us(v)
    err = p.get(error_field)
    if err:
        if err not in notes:
            notes.append(err)
        return f"error [{notes.index(err) + 1}]"
    return "n/a"


def md_table(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _sort_key(g):
    phase = 0 if g.get("phase") == "generation" else 1
    return (phase, int(g.get("tokens", 0)), int(g.get("batch", 0)), int(g.get("mtp", 0)))


def kernel_sections(go, peers, notes):
    out = []
    pairs = join(go.get("results", []), peers.get("results", []) if peers else [])
    groups = {}
    for g, p in pairs:
        groups.setdefault((g.get("kernel"), g.get("model"), g.get("format")), []).append((g, p))

    def order(k):
        kernel, model, fmt = k
        return (0 if kernel == "kv" else 1,
                MODEL_ORDER.index(model) if model in MODEL_ORDER else 9,
                FORMAT_ORDER.index(fmt) if fmt in FORMAT_ORDER else 9, str(k))

    for kernel, model, fmt in sorted(groups, key=order):
        rows = []
        for g, p in sorted(groups[(kernel, model, fmt)], key=lambda gp: _sort_key(gp[0])):
            rows.append([
                g.get("phase", "?"), g.get("batch", "?"), g.get("mtp", "?"), g.get("tokens", "?"),
                fmt_us(g.get("us")), fmt_num(g.get("gbps"), ".0f"), fmt_num(g.get("pct_copy"), ".1f"),
                peer_cell(p, "eager_us", "eager_error", notes), peer_cell(p, "compile_us", "compile_error", notes),
                fmt_ratio(ratio(p.get("eager_us") if p else None, g.get("us"))),
                fmt_ratio(ratio(p.get("compile_us") if p else None, g.get("us"))),
            ])
        title = f"### {KERNEL_TITLES.get(kernel, kernel)}: {MODEL_TITLES.get(model, model)}, {fmt}"
        out.append(title + "\n\n" + md_table(
            ["phase", "batch", "MTP", "tokens", "ours µs", "GB/s", "% of copy", "eager µs", "compile µs",
             "vs eager", "vs compile"], rows))
    return out, pairs


def iteration_section(go, peers):
    peer_iters = {(str(p.get("model")), int(p.get("batch", -1)), int(p.get("mtp", -1))): p
                  for p in (peers.get("iteration", []) if peers else [])}
    rows = []
    for g in go.get("iteration", []):
        p = peer_iters.get((str(g.get("model")), int(g.get("batch", -1)), int(g.get("mtp", -1))))
        pe = p.get("eager_us") if p else None
        pg = p.get("graph_us") if p else None
        pc = p.get("compile_us") if p else None
        pcg = p.get("compile_graph_us") if p else None
        rows.append([
            MODEL_TITLES.get(g.get("model"), g.get("model")), g.get("batch"), g.get("mtp"), g.get("layers"),
            fmt_us(g.get("eager_us")), fmt_us(g.get("graph_us")), fmt_us(g.get("header_graph_us")),
            fmt_us(g.get("long_graph_us")),
            fmt_ratio(ratio(g.get("eager_us"), g.get("graph_us"))),
            fmt_us(pe), fmt_us(pg), fmt_us(pc), fmt_us(pcg),
            fmt_ratio(ratio(best_peer_us(p), g.get("graph_us"))),
        ])
    if not rows:
        return None
    return ("### Decode iteration (every layer's KV + Q prologue)\n\n"
            "The PyTorch peer is the whole-layer function of bench/peers.py (per-iteration plan hoisted; "
            "compiled with torch.compile(fullgraph=True, dynamic=False)); \"compile + graph\" is every "
            "layer of the compiled peer in one CUDA graph. The ratio is against the peer's fastest. \"Ours "
            "header-driven\" is the graph of launches that read the batch's counts from the device header, as the "
            "engine's captured decode graph does; \"in a graph of two iterations\" is that iteration captured twice in "
            "one graph, per iteration, as in a server's graph of the whole model.\n\n" + md_table(
        ["model", "batch", "MTP", "layers", "ours eager µs (Go)", "ours graph µs", "ours header-driven graph µs",
         "ours header-driven, in a graph of two iterations, µs each",
         "graph vs our eager",
         "PyTorch eager µs", "PyTorch eager in a graph µs", "PyTorch compiled µs", "PyTorch compile + graph µs",
         "ours graph vs PyTorch's fastest"], rows))


def best_peer_us(p):
    """The fastest of the peer's iteration times, or None."""
    if not p:
        return None
    times = [p.get(k) for k in ("eager_us", "graph_us", "compile_us", "compile_graph_us") if _num(p.get(k))]
    return min(times) if times else None


# The serving engines' kernels, quoted from issue 11 (measured on one H200 before 2026-11-30:
# each layer its own inputs and cache, a CUDA graph of all layers, median of 50 replays). Only the
# fallback: with --engines (bench/engines.py, run in the same device call as ours) the measured
# figures replace them wherever it timed the shape. The same table is in cmd/bench/quoted.go.
QUOTED_SOURCE = ("quoted from issue 11 (measured on one H200 before 2026-11-30, not in this call: "
                 "the fallback where bench/engines.py timed no engine)")
QUOTED_LAYER = {  # (model, tokens): {peer: µs per layer}
    ("flash", 128): {"SGLang": 315.0 / 43, "vLLM": 573.0 / 43},
    ("pro", 128): {"SGLang": 710.0 / 61, "vLLM": 1275.0 / 61},
}
QUOTED_KV_CONTEXT = {16384: 16.9, 65536: 53.0}  # vLLM's KV kernel, V4-Flash, µs
# Issue 11's goals for the decode iteration through the graph, b=32 MTP 3, µs.
ITERATION_GOAL_US = {"flash": 200.0, "pro": 450.0}
HOST_COST_GOAL_US = 30.0


def _lg_key(r):
    return (str(r.get("model")), str(r.get("phase", "generation")), int(r.get("batch", -1)), int(r.get("mtp", 0)),
            str(r.get("q_format")))


def engine_layers(engines):
    """bench/engines.py's figures: {(model, phase, batch, mtp, tokens): {engine short name: µs a
    layer}}, from the engines it timed in the same call (the name's first word: SGLang, vLLM)."""
    out = {}
    for t in (engines or {}).get("timings", []):
        u = t.get("us_per_layer")
        if _num(u):
            key = (t.get("model"), t.get("phase"), int(t.get("batch", -1)), int(t.get("mtp", 0)), int(t.get("tokens", -1)))
            out.setdefault(key, {})[str(t.get("engine", "?")).split()[0]] = u
    return out


def serving_engines(measured, model, phase, batch, mtp, tokens):
    """(figures, how) for one shape: the measured figures where bench/engines.py timed it, else
    the quoted ones (generation shapes of 128 tokens only), else ({}, None)."""
    m = measured.get((model, phase, batch, mtp, tokens))
    if m:
        return m, "measured"
    q = QUOTED_LAYER.get((model, tokens)) if phase == "generation" else None
    return (q, "quoted") if q else ({}, None)


def layer_graph_section(go, peers, engines=None):
    """Ours per layer in a graph of many layers, beside the PyTorch peer's graph and the serving
    engines' kernels (measured in the same call by bench/engines.py, else quoted)."""
    measured = engine_layers(engines)
    peer_lg = {_lg_key(p): p for p in (peers.get("layer_graph", []) if peers else [])}
    groups = {}
    for g in go.get("layer_graph", []):
        groups.setdefault(g.get("model"), []).append(g)
    out = []
    for model in sorted(groups, key=lambda m: MODEL_ORDER.index(m) if m in MODEL_ORDER else 9):
        rows = []
        for g in sorted(groups[model], key=lambda g: (_sort_key(g), str(g.get("q_format")))):
            p = peer_lg.get(_lg_key(g))
            pu = p.get("us_per_layer") if p else None
            quoted, how = serving_engines(measured, model, g.get("phase"), int(g.get("batch", -1)), int(g.get("mtp", 0)),
                                          int(g.get("tokens", -1)))
            rows.append([
                g.get("phase"), g.get("batch"), g.get("mtp"), g.get("tokens"), g.get("rows"), g.get("q_format"),
                f"{g.get('layers')} ({g.get('sets')} sets)", fmt_us(g.get("total_us")), fmt_us(g.get("us_per_layer")),
                fmt_us(g.get("cold_layer_us")), fmt_us(g.get("copy_us_per_layer")), fmt_num(g.get("pct_copy"), ".1f"),
                fmt_us(pu), fmt_ratio(ratio(pu, g.get("us_per_layer"))),
                ", ".join(f"{k} {fmt_us(v)} ({fmt_ratio(ratio(v, g.get('us_per_layer')))})" for k, v in quoted.items())
                + (" (quoted)" if how == "quoted" else "") if quoted else "",
            ])
        out.append(f"### Time per layer in a CUDA graph of many layers: {MODEL_TITLES.get(model, model)}\n\n"
                   "Every layer its own inputs, weight, cache pool and Q output; all layers of the iteration in one "
                   "graph, the L2 flushed before each replay (median); per layer = total / layers. Generation "
                   "batches are padded to the engine's graph bucket (rows). Cold layer: one layer launched alone "
                   "with the L2 flushed. Copy: the layer's bytes at the measured copy rate. Serving engines: "
                   + ("their kernels built from source and timed the same way in this call (bench/engines.py); "
                      f"elsewhere {QUOTED_SOURCE}" if measured else QUOTED_SOURCE) + ".\n\n" + md_table(
                       ["phase", "batch", "MTP", "tokens", "rows", "Q", "layers", "ours total µs", "ours µs/layer",
                        "cold layer µs", "copy µs/layer", "% of copy", "PyTorch µs/layer", "vs PyTorch",
                        "serving engines µs/layer"], rows))
    return out


# Issue 9's goals for the whole chain per layer at b=32 MTP 3, µs.
CHAIN_GOAL_US = {"flash": 20.0, "pro": 40.0}
# The KV prologue counts as hidden under the GEMMs when the fork leaves at most this much of it:
# max(CHAIN_KV_HIDDEN_US, CHAIN_KV_HIDDEN_FRAC of the chain without it) (replay noise).
CHAIN_KV_HIDDEN_US = 0.5
CHAIN_KV_HIDDEN_FRAC = 0.02
SCALED_MM_PREFIX = "torch._scaled_mm"


def _chain_key(r):
    return (str(r.get("model")), str(r.get("phase")), int(r.get("batch", -1)), int(r.get("mtp", 0)),
            int(r.get("tokens", -1)))


def _chain_rows(go, chain):
    """Our chain rows: the --chain file's, else the --go report's own."""
    if chain and chain.get("chain"):
        return chain["chain"]
    return go.get("chain") or []


def _peer_gemm(p, notes):
    """'scaled_mm', or 'fallback [n]' with the reason kept for a footnote."""
    if not p or not isinstance(p.get("gemm"), dict):
        return "n/a"
    cells = []
    for name in ("fused", "wq_b"):
        text = str(p["gemm"].get(name, "?"))
        if text.startswith(SCALED_MM_PREFIX):
            cells.append("scaled_mm")
        else:
            if text not in notes:
                notes.append(text)
            cells.append(f"fallback [{notes.index(text) + 1}]")
    return " / ".join(cells)


def chain_kv_hidden(g):
    """Whether the fork hid the KV prologue: True, False, or None when not measured."""
    e, no_kv = g.get("kv_exposed_us"), g.get("no_kv_us_per_layer")
    if not _num(e) or not _num(no_kv):
        return None
    return e <= max(CHAIN_KV_HIDDEN_US, CHAIN_KV_HIDDEN_FRAC * no_kv)


def chain_sections(go, chain, chain_peer, notes):
    """Per model: the whole chain per layer, ours beside the PyTorch chain peer and the floors."""
    rows_all = _chain_rows(go, chain)
    peer = {_chain_key(p): p for p in (chain_peer.get("chain", []) if chain_peer else [])}
    groups = {}
    for g in rows_all:
        groups.setdefault(g.get("model"), []).append(g)
    out = []
    for model in sorted(groups, key=lambda m: MODEL_ORDER.index(m) if m in MODEL_ORDER else 9):
        rows = []
        for g in sorted(groups[model], key=_sort_key):
            p = peer.get(_chain_key(g))
            pu = p.get("us_per_layer") if p else None
            if p and not _num(pu) and p.get("errors"):
                err = "; ".join(f"{k}: {v}" for k, v in p["errors"].items())
                if err not in notes:
                    notes.append(err)
                pcell = f"error [{notes.index(err) + 1}]"
            else:
                pcell = fmt_us(pu)
            hidden = chain_kv_hidden(g)
            rows.append([
                g.get("phase"), g.get("batch"), g.get("mtp"), g.get("tokens"), g.get("rows"),
                f"{g.get('fused_gemm')} / {g.get('wq_b_gemm')}",
                fmt_us(g.get("us_per_layer")), fmt_us(g.get("no_kv_us_per_layer")),
                fmt_us(g.get("serial_kv_us_per_layer")), fmt_us(g.get("kv_alone_us_per_layer")),
                fmt_num(g.get("kv_exposed_us"), "+.2f") + ("" if hidden is None else (" ✓" if hidden else " ✗")),
                fmt_num(g.get("weight_bytes", 0) / 1e6 if _num(g.get("weight_bytes")) else None, ".1f"),
                fmt_num(g.get("weight_gbps"), ".0f"), fmt_us(g.get("weight_floor_us")),
                fmt_num(g.get("pct_weight_floor"), ".1f"), fmt_us(g.get("floor_us")),
                pcell, fmt_us(p.get("no_kv_us_per_layer") if p else None), _peer_gemm(p, notes),
                fmt_ratio(ratio(pu, g.get("us_per_layer"))),
            ])
        out.append(f"### The whole chain from hidden states, per layer: {MODEL_TITLES.get(model, model)}\n\n"
                   "act_quant, the fused [wq_a; wkv] FP8 GEMM, q_norm + act_quant, the wq_b FP8 GEMM, the Q "
                   "prologue, and the KV prologue forked onto a second stream after the first GEMM (the engine's "
                   "chain). Every layer its own weights (and, memory allowing, its own hidden rows, activations, "
                   "outputs and cache pool), all layers in one CUDA graph, the L2 flushed before each replay "
                   "(median); per layer = total / layers. Generation batches run over their graph bucket (rows). "
                   "GEMMs: which implementation ran (own = the weight-streaming kernel). No KV: the same graph "
                   "without the KV prologue; in order: the KV prologue on the main stream; alone: only it. KV "
                   "exposed = forked - no KV (✓: hidden, at most "
                   f"max({CHAIN_KV_HIDDEN_US} µs, {100 * CHAIN_KV_HIDDEN_FRAC:.0f}% of no KV)). Weight floor: the "
                   "layer's weights at the measured copy rate; floor with I/O adds the hidden rows read and the "
                   "FP8 Q and cache rows written. PyTorch: bench/chain_peer.py (torch._scaled_mm with block-wise "
                   "scales, torch.compile for the rest, one CUDA graph), with KV and without.\n\n" + md_table(
                       ["phase", "batch", "MTP", "tokens", "rows", "GEMMs", "ours µs/layer", "no KV µs",
                        "KV in order µs", "KV alone µs", "KV exposed µs", "weights MB", "weight GB/s",
                        "weight floor µs", "% of floor", "floor with I/O µs", "PyTorch µs/layer", "PyTorch no KV µs",
                        "PyTorch GEMMs", "vs PyTorch"], rows))
    return out


def chain_goals(go, chain, chain_peer):
    rows_all = _chain_rows(go, chain)
    if not rows_all and not chain_peer:
        return None
    lines = []
    for model, goal in CHAIN_GOAL_US.items():
        g = next((g for g in rows_all if g.get("model") == model and g.get("phase") == "generation"
                  and g.get("batch") == 32 and g.get("mtp") == 3), None)
        if g is None:
            lines.append(f"- ? Chain {MODEL_TITLES[model]} b=32 MTP 3 <= {goal:.0f} µs a layer: not measured")
            continue
        u = g.get("us_per_layer")
        mark = "✓" if _num(u) and u <= goal else "✗"
        lines.append(f"- {mark} Chain {MODEL_TITLES[model]} b=32 MTP 3: {fmt_us(u)} µs a layer (goal <= {goal:.0f} µs; "
                     f"weight floor {fmt_us(g.get('weight_floor_us'))} µs, GEMMs {g.get('fused_gemm')} / {g.get('wq_b_gemm')})")
    measured = [g for g in rows_all if chain_kv_hidden(g) is not None]
    misses = [g for g in measured if not chain_kv_hidden(g)]
    lines.append(_goal("KV prologue hidden under the GEMMs (forked - no KV <= "
                       f"max({CHAIN_KV_HIDDEN_US} µs, {100 * CHAIN_KV_HIDDEN_FRAC:.0f}%))", len(measured), misses,
                       lambda g: f"{MODEL_TITLES.get(g.get('model'), g.get('model'))} {g.get('phase')} b={g.get('batch')} "
                                 f"MTP {g.get('mtp')} T={g.get('tokens')}: {fmt_num(g.get('kv_exposed_us'), '+.2f')} µs "
                                 f"exposed of {fmt_us(g.get('kv_alone_us_per_layer'))} µs alone"))
    peer = {_chain_key(p): p for p in (chain_peer.get("chain", []) if chain_peer else [])}
    both = [(g, peer.get(_chain_key(g))) for g in rows_all]
    both = [(g, p) for g, p in both if p is not None and _num(p.get("us_per_layer"))]
    slower = [g for g, p in both if (ratio(p["us_per_layer"], g.get("us_per_layer")) or 0) < 1]
    lines.append(_goal("Chain faster than the PyTorch chain (_scaled_mm + torch.compile, one graph)", len(both), slower,
                       lambda g: f"{MODEL_TITLES.get(g.get('model'), g.get('model'))} {g.get('phase')} b={g.get('batch')} "
                                 f"MTP {g.get('mtp')}: {fmt_ratio(ratio(peer[_chain_key(g)]['us_per_layer'], g.get('us_per_layer')))}"))
    for p in (chain_peer.get("chain", []) if chain_peer else []):
        chk = p.get("gemm_check")
        if chk:
            lines.append(f"- {'✓' if chk.get('ok') else '✗'} PyTorch peer's GEMMs against a float32 reference "
                         f"({MODEL_TITLES.get(p.get('model'), p.get('model'))}, {chk.get('rows')} rows): fused "
                         f"{fmt_num(chk.get('fused_rel_err'), '.2e')}, wq_b {fmt_num(chk.get('wq_b_rel_err'), '.2e')} "
                         "of the output's maximum (within 1%)")
    return "### Goals (issue 9)\n\n" + "\n".join(lines)


def host_cost_section(go):
    rows = [[h.get("backend"), MODEL_TITLES.get(h.get("model"), h.get("model")), h.get("batch"), h.get("mtp"),
             h.get("tokens"), "yes" if h.get("graphs") else "no", fmt_us(h.get("begin_us")), fmt_us(h.get("end_us")),
             fmt_us(h.get("total_us"))] for h in go.get("host_cost", [])]
    if not rows:
        return None
    return ("### The engine's host cost per iteration (Begin + End)\n\n"
            "Begin: plan, page reservation, metadata build and upload; End on an idle device: the wait and the "
            "commit (the layers run outside the timed spans). Median wall time.\n\n"
            + md_table(["backend", "model", "batch", "MTP", "tokens", "graphs", "Begin µs", "End µs", "Begin + End µs"],
                       rows))


def _largest_chain_floor(go, model):
    """The dependent-chain floor with the L2 prefetch at its largest batch,
    or None. cmd/bench measures it at 1, 32 and 128 tokens (rows: tokens x
    heads), so the largest is the b=32 MTP 3 iteration's 128 tokens."""
    floors = [f for f in go.get("chain_floor", []) if f.get("model") == model and f.get("prefetch")
              and _num(f.get("total_us")) and _num(f.get("rows"))]
    return max(floors, key=lambda f: f["rows"]) if floors else None


def issue11_goals(go, engines=None):
    lines = []
    for it in go.get("iteration", []):
        goal = ITERATION_GOAL_US.get(it.get("model"))
        if goal is None or it.get("batch") != 32 or it.get("mtp") != 3:
            continue
        for key, how in (("graph_us", "plain launches"), ("header_graph_us", "header-driven launches, as the engine's"),
                         ("long_graph_us", "header-driven, in a graph of two iterations, per iteration")):
            t = it.get(key)
            if not _num(t):
                continue
            mark = "✓" if t <= goal else "✗"
            lines.append(f"- {mark} Decode iteration {MODEL_TITLES[it['model']]} b=32 MTP 3, fp8 Q, through the graph "
                         f"({how}): {fmt_us(t)} µs ({it.get('layers')} layers; goal <= {goal:.0f} µs)")
    lgs = go.get("layer_graph", [])
    for model, goal in ITERATION_GOAL_US.items():
        floor = _largest_chain_floor(go, model)
        for q in ("fp8", "bf16"):
            g = next((g for g in lgs if g.get("model") == model and g.get("phase") == "generation"
                      and g.get("batch") == 32 and g.get("mtp") == 3 and g.get("q_format") == q), None)
            if g is None:
                lines.append(f"- ? Decode iteration {MODEL_TITLES[model]} b=32 MTP 3, {q} Q, <= {goal:.0f} µs: not measured")
                continue
            t = g.get("total_us")
            mark = "✓" if _num(t) and t <= goal else "✗"
            lines.append(f"- {mark} Decode iteration {MODEL_TITLES[model]} b=32 MTP 3, {q} Q, the layer graph "
                         f"(L2 flushed before each replay): {fmt_us(t)} µs ({g.get('layers')} layers; goal <= {goal:.0f} µs)")
            if q == "fp8" and floor is not None and _num(t):
                f = floor["total_us"]
                lines.append(f"  - its floor: a kernel that only copies the same {floor.get('rows')} Q rows a layer "
                             f"(1 KiB read and 512 bytes written a row, as fp8 Q) with the same L2 prefetch, replayed "
                             f"like the layer graph, takes {fmt_us(f)} µs; the goal is {100 * (goal / f - 1):+.1f}% "
                             f"from it, the layer graph {100 * (t / f - 1):+.1f}%")
    measured = engine_layers(engines)
    for g in lgs:
        figs, how = serving_engines(measured, g.get("model"), g.get("phase"), int(g.get("batch", -1)),
                                    int(g.get("mtp", 0)), int(g.get("tokens", -1)))
        if not figs or g.get("model") not in MODEL_TITLES:
            continue
        best = min(figs.values())
        u = g.get("us_per_layer")
        mark = "✓" if _num(u) and u <= best else "✗"
        shape = (f"b={g.get('batch')} MTP {g.get('mtp')}" if g.get("phase") == "generation"
                 else f"{g.get('tokens')} context tokens")
        lines.append(f"- {mark} {MODEL_TITLES[g['model']]} {shape} {g.get('q_format')} Q: "
                     f"{fmt_us(u)} µs a layer against the fastest engine's {fmt_us(best)} ({how})")
    for tokens, theirs in QUOTED_KV_CONTEXT.items():
        for r in go.get("results", []):
            if (r.get("kernel"), r.get("model"), r.get("format"), r.get("phase"), r.get("tokens")) == \
                    ("kv", "flash", "fp8_ue8m0", "context", tokens) and not r.get("variant"):
                u = r.get("us")
                mark = "✓" if _num(u) and u <= theirs else "✗"
                lines.append(f"- {mark} KV V4-Flash at {tokens} context tokens: {fmt_us(u)} µs (cold single launch) "
                             f"against vLLM's {fmt_us(theirs)} µs (quoted)")
    for r in go.get("results", []):
        if r.get("kernel") == "q" and r.get("phase") == "context" and int(r.get("tokens", 0)) >= 16384 \
                and not r.get("variant"):
            pc = r.get("pct_copy")
            mark = "✓" if _num(pc) and pc >= 95 else "✗"
            same = r.get("pct_same_size_copy")
            also = f"; {fmt_num(same, '.1f')}% of a same-size copy timed the same way" if _num(same) else ""
            lines.append(f"- {mark} Q {MODEL_TITLES.get(r.get('model'), r.get('model'))} {r.get('format')} at "
                         f"{r.get('tokens')} tokens: {fmt_num(pc, '.1f')}% of copy (goal >= 95%{also})")
    for h in go.get("host_cost", []):
        if h.get("batch") == 256:
            t = h.get("total_us")
            mark = "✓" if _num(t) and t <= HOST_COST_GOAL_US else "✗"
            lines.append(f"- {mark} Engine host cost {h.get('backend')} {MODEL_TITLES.get(h.get('model'), h.get('model'))} "
                         f"b=256 MTP {h.get('mtp')}: {fmt_us(t)} µs (goal <= {HOST_COST_GOAL_US:.0f} µs)")
    if not lines:
        return None
    return "### Goals (issue 11)\n\n" + "\n".join(lines)


def goals_section(go, pairs, peers):
    lines = []
    ctx = [(g, p) for g, p in pairs if g.get("phase") == "context" and int(g.get("tokens", 0)) >= 16384]
    misses = [g for g, _ in ctx if not (_num(g.get("pct_copy")) and g["pct_copy"] >= 90)]
    lines.append(_goal("Context batches of 16K+ tokens at >= 90% of copy bandwidth", len(ctx), misses,
                       lambda g: f"{_label(g)}: {fmt_num(g.get('pct_copy'), '.1f')}% of copy"))
    with_compile = [(g, p) for g, p in pairs if p is not None and _num(p.get("compile_us"))]
    misses = [g for g, p in with_compile if ratio(p["compile_us"], g.get("us")) is None
              or ratio(p["compile_us"], g.get("us")) < 1]
    lines.append(_goal("Every shape faster than torch.compile", len(with_compile), misses,
                       lambda g: f"{_label(g)}: {fmt_ratio(ratio(_peer(pairs, g).get('compile_us'), g.get('us')))}"))
    no_compile = sum(1 for g, p in pairs if p is None or not _num(p.get("compile_us")))
    if no_compile:
        lines.append(f"  - {no_compile} shapes have no torch.compile time to compare with")
    small = [(g, p) for g, p in pairs if g.get("phase") == "generation" and int(g.get("batch", 0)) <= 32
             and p is not None and _num(p.get("eager_us"))]
    misses = [g for g, p in small if (ratio(p["eager_us"], g.get("us")) or 0) < 3]
    lines.append(_goal("Generation batches of 32 and fewer at least 3× faster than PyTorch eager", len(small),
                       misses, lambda g: f"{_label(g)}: {fmt_ratio(ratio(_peer(pairs, g).get('eager_us'), g.get('us')))}"))
    peer_iters = {(str(p.get("model")), int(p.get("batch", -1)), int(p.get("mtp", -1))): p
                  for p in (peers.get("iteration", []) if peers else [])}
    for g in go.get("iteration", []):
        name = f"{MODEL_TITLES.get(g.get('model'), g.get('model'))} b={g.get('batch')} MTP {g.get('mtp')}"
        r = ratio(g.get("eager_us"), g.get("graph_us"))
        lines.append(f"- {_mark(r, 3)} Decode iteration {name}: graph vs our eager "
                     f"launch {fmt_ratio(r)} (goal: 3×)")
        p = peer_iters.get((str(g.get("model")), int(g.get("batch", -1)), int(g.get("mtp", -1))))
        r = ratio(best_peer_us(p), g.get("graph_us"))
        lines.append(f"- {_mark(r, 1)} Decode iteration {name}: ours graph vs "
                     f"the PyTorch peer's fastest (compiled, in a CUDA graph) {fmt_ratio(r)} (goal: faster)")
    return "### Goals (issue 5)\n\n" + "\n".join(lines)


def _mark(r, goal):
    if r is None:
        return "?"
    return "✓" if r >= goal else "✗"


def _peer(pairs, g):
    for gg, p in pairs:
        if gg is g:
            return p or {}
    return {}


def _label(g):
    return (f"{g.get('kernel')} {MODEL_TITLES.get(g.get('model'), g.get('model'))} {g.get('format')} "
            f"{g.get('phase')} b={g.get('batch')} MTP {g.get('mtp')} T={g.get('tokens')}")


def _goal(title, n, misses, describe):
    if n == 0:
        return f"- ? {title}: no measured shapes"
    mark = "✓" if not misses else "✗"
    line = f"- {mark} {title}: {n - len(misses)} of {n} shapes"
    for g in misses:
        line += f"\n  - miss: {describe(g)}"
    return line


def check_section(check):
    rows = check.get("rows", [])
    errors = check.get("errors", [])
    n_ok = sum(1 for r in rows if r.get("ok"))
    lines = ["### Equal work (bench/check_peers.py)\n",
             f"{n_ok} of {len(rows)} comparisons passed" + (f", {len(errors)} files failed to check" if errors else "")
             + ". Every decoded value of the peers within one quantum of ours (RoPE values: plus 2^-6 of the pair), "
               "UE8M0 exponents equal (off by one in at most 1% of the groups), no byte outside the written slots changed.\n"]
    table = []
    for r in rows:
        table.append([r.get("case"), r.get("part"), r.get("format"), r.get("tokens"), r.get("values"),
                      r.get("failed"), fmt_num(r.get("max_err_quanta"), ".3g"),
                      fmt_num(100 * r["bytes_equal"], ".3f") + "%" if _num(r.get("bytes_equal")) else "n/a",
                      "pass" if r.get("ok") else "FAIL"])
    if table:
        lines.append(md_table(["case", "part", "format", "tokens", "values", "failed", "max err (quanta)",
                               "bytes equal", "result"], table))
    for e in errors:
        lines.append(f"- {e.get('case')}: {e.get('error')}")
    return "\n".join(lines)


def build(go, peers, check=None, chain=None, chain_peer=None, engines=None):
    # Go writes an empty list as null (a chain-only run has no results): drop those keys.
    go = {k: v for k, v in go.items() if v is not None}
    notes = []
    out = ["## Benchmarks", ""]
    out.append(f"- Ours: {go.get('device', '?')}, {go.get('date', '?')}; device-to-device copy "
               f"{fmt_num(go.get('copy_gbps'), '.0f')} GB/s")
    if peers:
        out.append(f"- Peers: {peers.get('device', '?')}, {peers.get('date', '?')}; torch {peers.get('torch', '?')}, "
                   f"triton {peers.get('triton', '?')}; copy {fmt_num(peers.get('copy_gbps'), '.0f')} GB/s")
        diff = [r for r in peers.get("results", []) if _num(r.get("compile_diff_bytes")) and r["compile_diff_bytes"] > 0]
        if diff:
            out.append(f"- torch.compile's output differs from eager's in {len(diff)} shapes "
                       f"(at most {max(r['compile_diff_bytes'] for r in diff)} bytes): Inductor contracts "
                       "multiply-adds and divides differently; the eager peer is the one checked against ours")
        if peers.get("selftest") is not None:
            st = peers["selftest"]
            out.append(f"- Peers' self-test against a float64 model: {'ok' if st.get('ok') else 'FAILED'}")
    else:
        out.append("- Peers: no peers JSON given (every peer column is n/a)")
    for doc, who in ((go, "ours"), (peers or {}, "peers")):
        if doc.get("command"):
            out.append(f"- Command ({who}): `{doc['command']}`")
    if chain_peer:
        out.append(f"- Chain peer: {chain_peer.get('device', '?')}, {chain_peer.get('date', '?')}; torch "
                   f"{chain_peer.get('torch', '?')}; copy {fmt_num(chain_peer.get('copy_gbps'), '.0f')} GB/s; "
                   f"torch.compile: " + ", ".join(f"{k} {v}" for k, v in (chain_peer.get("compile") or {}).items()))
    if chain and chain.get("command"):
        out.append(f"- Command (ours, chain): `{chain['command']}`")
    cg = (chain or {}).get("chain_gemm") or go.get("chain_gemm")
    if cg:
        out.append(f"- Chain GEMMs: {cg}")
    out.append("- Ratios are peer time / our time.")
    out.append("")
    sections, pairs = kernel_sections(go, peers, notes)
    out.extend(s + "\n" for s in sections)
    it = iteration_section(go, peers)
    if it:
        out.append(it + "\n")
    out.extend(s + "\n" for s in layer_graph_section(go, peers, engines))
    out.extend(s + "\n" for s in chain_sections(go, chain, chain_peer, notes))
    hc = host_cost_section(go)
    if hc:
        out.append(hc + "\n")
    cgoals = chain_goals(go, chain, chain_peer)
    if cgoals:
        out.append(cgoals + "\n")
    if go.get("results") or go.get("iteration") or go.get("layer_graph") or peers:
        out.append(goals_section(go, pairs, peers) + "\n")
    g11 = issue11_goals(go, engines) if (go.get("results") or go.get("layer_graph") or go.get("host_cost") or go.get("iteration")) else None
    if g11:
        out.append(g11 + "\n")
    if check is not None:
        out.append(check_section(check) + "\n")
    if notes:
        out.append("Peer errors:\n")
        out.extend(f"{i + 1}. `{n}`" for i, n in enumerate(notes))
        out.append("")
    unmatched = sum(1 for _, p in pairs if p is None)
    if peers and unmatched:
        out.append(f"({unmatched} of our rows had no peers entry with the same shape.)\n")
    return "\n".join(out)


def _load(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise SystemExit(f"--{what} {path}: no such file")
    except json.JSONDecodeError as e:
        raise SystemExit(f"--{what} {path}: not JSON ({e})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--go", required=True, help="our benchmark's JSON (cmd/bench)")
    p.add_argument("--peers", default=None, help="bench/peers.py's JSON")
    p.add_argument("--check", default=None, help="bench/check_peers.py --json output")
    p.add_argument("--chain", default=None, help="our chain JSON (cmd/bench --chain-only); default: --go's chain rows")
    p.add_argument("--chain-peer", default=None, help="bench/chain_peer.py's JSON")
    p.add_argument("--engines", default=None, help="bench/engines.py's JSON: the serving engines measured in the same call")
    p.add_argument("--markdown", default=None, help="also write the Markdown here")
    args = p.parse_args(argv)
    go = _load(args.go, "go")
    peers = _load(args.peers, "peers") if args.peers else None
    check = _load(args.check, "check") if args.check else None
    chain = _load(args.chain, "chain") if args.chain else None
    chain_peer = _load(args.chain_peer, "chain-peer") if args.chain_peer else None
    engines = _load(args.engines, "engines") if args.engines else None
    text = build(go, peers, check, chain, chain_peer, engines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
