#!/usr/bin/env python3
"""DeepGEMM beside our FP8 GEMMs and our indexer score, on the device (issue 25, issue 24).

DeepGEMM (github.com/deepseek-ai/DeepGEMM) is built from its public source on the device by
`.gpu-dg/run.sh`; this script is only the harness around it. Subcommands:

  build   --src DIR             compile DeepGEMM's torch extension (its csrc/python_api.cpp)
                                into DIR/deep_gemm/_C.so with torch.utils.cpp_extension
  prewarm --src DIR --part I --parts N
                                JIT-compile the kernels `bench` will call (share I of N, so
                                that N processes fill DG_JIT_CACHE_DIR in parallel)
  probe   --src DIR [--indexer] one small call of each kind, each step announced before it runs
  bench   --src DIR --out DIR [--budget S]
                                time and check; writes DIR/deepgemm.json and DIR/deepgemm.txt

What `bench` measures (the same method as TestGEMMTimes in attention/mla/cuda):
- `deep_gemm.fp8_gemm_nt` (SM90: the 1D2D kernel, bf16 out) at our chain's shapes and
  M = 1, 8, 32, 128, 512, e4m3 operands with float32 block scales in DeepSeek-V4's layout
  (activation 1x128, weight 128x128; scales spread over 2^-4..2^4 per block), cast by
  DeepGEMM's own helpers. "cold": a CUDA graph of 20 (256 MB L2 flush, GEMM) pairs less a
  graph of the 20 flushes; "b2b": a graph of 20 GEMMs; each the median of 5 replays.
  GB/s counts the FP8 weight bytes; the copy rate is a 1 GiB device-to-device torch copy
  timed here, counted as read + write (bench/peers.py's convention).
- every result checked against a float32 torch product of the dequantized operands
  (calc_diff < 1e-3 and max |error| < 2% of max |reference|).
- the lightning indexer's paged FP8 MQA logits (`fp8_paged_mqa_logits`) at decode b = 32,
  MTP 3 (4 query tokens a sequence), 64 heads of 128, at 2048 and 16384 compressed entries
  a sequence (8K and 64K context tokens at ratio 4). SM90 takes next_n <= 2, so a sequence's
  4 tokens run as 2 rows of next_n = 2 sharing its block table (and once as 4 rows of
  next_n = 1); the FP4 variant is SM100-only in DeepGEMM.
"""

import argparse
import json
import os
import statistics
import sys
import time

GEMMS = [  # name, N, K: attention/mla/mlatest FlashGEMMs, ProGEMMs, TestGEMMTimes' indexer wq_b
    ("flash-wqa-wkv", 1536, 4096),
    ("flash-wqb", 32768, 1024),
    ("pro-wqa-wkv", 2048, 7168),
    ("pro-wqb", 65536, 1536),
    ("flash-idx-wqb", 8192, 1024),
    ("pro-idx-wqb", 8192, 1536),
]
ROWS = [1, 8, 32, 128, 512]
# Decode b = 32 MTP 3; entries a sequence (context tokens / 4); next_n per row.
INDEXER = [(2048, 2), (16384, 2), (2048, 1), (16384, 1)]
IDX_SEQS, IDX_TOKENS, IDX_HEADS, IDX_DIM, IDX_BLOCK = 32, 4, 64, 128, 64
REPS = 20


def log(*a):
    print(*a, flush=True)


def import_dg(src):
    sys.path.insert(0, src)
    import deep_gemm  # noqa: E402
    return deep_gemm


# ---------------------------------------------------------------- build

def cmd_build(args):
    import torch
    from torch.utils import cpp_extension
    src = os.path.abspath(args.src)
    cuda_home = cpp_extension.CUDA_HOME
    log(f"build: torch {torch.__version__} (CUDA {torch.version.cuda}), CUDA_HOME {cuda_home}, "
        f"cxx11 abi {int(torch.compiled_with_cxx11_abi())}, host opt {args.opt}")
    bdir = os.path.join(src, "build-ext")
    os.makedirs(bdir, exist_ok=True)
    t0 = time.time()
    # The flags of DeepGEMM's setup.py, except the host optimization level (the host code
    # only plans and launches; everything timed here runs from CUDA graphs) and the C++
    # standard where torch's headers need C++20 (torch 2.13 on).
    major, minor = (int(v) for v in torch.__version__.split(".")[:2])
    std = "-std=c++20" if (major, minor) >= (2, 13) else "-std=c++17"
    cpp_extension.load(
        name="_C",
        sources=[os.path.join(src, "csrc/python_api.cpp")],
        extra_cflags=[std, args.opt, "-fPIC", "-Wno-psabi", "-Wno-deprecated-declarations",
                      f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"],
        extra_include_paths=[f"{cuda_home}/include", f"{cuda_home}/include/cccl",
                             os.path.join(src, "deep_gemm/include"),
                             os.path.join(src, "third-party/cutlass/include"),
                             os.path.join(src, "third-party/fmt/include")],
        # The shared C++ runtime, the one torch uses. This device's /opt/gcc g++ (its $CXX) links
        # libstdc++ statically: that build carried a second C++ runtime into the process (its
        # std::locale and exceptions, with std::filesystem taken from torch's), and it segfaulted
        # at DeepGEMM's first JIT call (2026-12-02 07:38 UTC call).
        extra_ldflags=[f"-L{cuda_home}/lib64", f"-L{cuda_home}/lib", "-lcudart", "-lnvrtc", "-l:libstdc++.so.6"],
        build_directory=bdir, with_cuda=True, verbose=True, is_python_module=True)
    so = os.path.join(bdir, "_C.so")
    dst = os.path.join(src, "deep_gemm", "_C.so")
    with open(so, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())
    log(f"build: {so} -> {dst} ({os.path.getsize(dst)} bytes) in {time.time() - t0:.1f} s")


# ---------------------------------------------------------------- inputs

def gemm_inputs(dg, torch, m, n, k, gen, random_data=True):
    """x [m, k] and w [n, k] as e4m3 with DeepGEMM's scale layouts (SM90, float scales)."""
    from deep_gemm.utils import per_token_cast_to_fp8, per_block_cast_to_fp8, ceil_div, align
    dev = "cuda"
    if random_data:
        def spread(rows, cols, br, bc):
            e = torch.randint(-4, 5, (ceil_div(rows, br), ceil_div(cols, bc)), generator=gen, device=dev)
            return torch.pow(2.0, e.float()).repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
        x = (torch.randn((m, k), generator=gen, device=dev) * spread(m, k, 1, 128)).bfloat16()
        w = (torch.randn((n, k), generator=gen, device=dev) * spread(n, k, 128, 128)).bfloat16()
        xq, sx = per_token_cast_to_fp8(x, use_ue8m0=False)
        wq, sw = per_block_cast_to_fp8(w, use_ue8m0=False)
        del x, w
    else:  # prewarm: the kernel depends on the shapes only
        xq = torch.zeros((m, k), device=dev, dtype=torch.float8_e4m3fn)
        sx = torch.ones((m, ceil_div(k, 128)), device=dev, dtype=torch.float)
        wq = torch.zeros((n, k), device=dev, dtype=torch.float8_e4m3fn)
        sw = torch.ones((ceil_div(n, 128), ceil_div(k, 128)), device=dev, dtype=torch.float)
    # The activation scales MN-major and TMA-aligned, as the SM90 kernel reads them, laid out
    # here so that DeepGEMM's own transform (checked below) has nothing to do inside the call.
    aligned = dg.get_tma_aligned_size(m, 4) if hasattr(dg, "get_tma_aligned_size") else align(m, 4)
    sx_t = torch.empty_strided(sx.shape, (1, aligned), device=dev, dtype=torch.float)
    sx_t.copy_(sx)
    same = dg.get_mn_major_tma_aligned_tensor(sx_t)
    if same.data_ptr() != sx_t.data_ptr():  # DeepGEMM transposed them: use its layout (and say so)
        log(f"note: m={m} k={k}: activation scales re-laid out by DeepGEMM's helper")
        sx_t = same
    return (xq, sx_t), (wq, sw)


def dequant(q, s, br, bc):
    rows, cols = q.shape
    full = s.repeat_interleave(br, 0)[:rows].repeat_interleave(bc, 1)[:, :cols]
    return q.float() * full


def paged_inputs(torch, entries, next_n, gen):
    """DeepGEMM's paged FP8 key cache: per block of 64 keys, 64 x 128 e4m3 then 64 float scales."""
    dev = "cuda"
    blocks_per_seq = (entries + IDX_BLOCK - 1) // IDX_BLOCK
    nblocks = IDX_SEQS * blocks_per_seq
    keys = torch.randn((nblocks, IDX_BLOCK, IDX_DIM), generator=gen, device=dev)
    amax = keys.abs().amax(dim=2, keepdim=True).clamp(1e-4)
    scale = amax / 448.0
    kq = (keys / scale).to(torch.float8_e4m3fn)
    del keys
    cache = torch.empty((nblocks, IDX_BLOCK * (IDX_DIM + 4)), device=dev, dtype=torch.uint8)
    cache[:, :IDX_BLOCK * IDX_DIM] = kq.view(nblocks, IDX_BLOCK * IDX_DIM).view(torch.uint8)
    cache[:, IDX_BLOCK * IDX_DIM:] = scale.view(nblocks, IDX_BLOCK).contiguous().view(torch.uint8)
    cache = cache.view(nblocks, IDX_BLOCK, 1, IDX_DIM + 4)
    perm = torch.randperm(nblocks, generator=gen, device=dev).int()
    seq_table = perm.view(IDX_SEQS, blocks_per_seq)
    groups = IDX_TOKENS // next_n
    batch = IDX_SEQS * groups
    table = seq_table.repeat_interleave(groups, 0).contiguous()
    q = torch.randn((batch, next_n, IDX_HEADS, IDX_DIM), generator=gen, device=dev).to(torch.float8_e4m3fn)
    weights = torch.randn((batch * next_n, IDX_HEADS), generator=gen, device=dev)
    lens = torch.full((batch, next_n), entries, device=dev, dtype=torch.int32)
    return dict(q=q, cache=cache, kq=kq, scale=scale, table=table, weights=weights, lens=lens,
                max_len=blocks_per_seq * IDX_BLOCK, batch=batch, groups=groups)


def paged_call(dg, p):
    meta = dg.get_paged_mqa_logits_metadata(p["lens"], IDX_BLOCK, dg.get_num_sms())
    return dg.fp8_paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"], meta,
                                   p["max_len"], False)


# ---------------------------------------------------------------- prewarm

def items():
    """The bench's calls, most wanted first (so a short budget keeps the main shapes)."""
    out = []
    for m in (1, 128, 32, 8, 512):
        for name, n, k in GEMMS:
            out.append(("gemm", name, n, k, m))
    for entries, next_n in INDEXER:
        out.insert(8 if next_n == 2 else len(out), ("indexer", f"e{entries}-nn{next_n}", entries, next_n, 0))
    return out


def cmd_probe(args):
    """One small call of each kind, each step announced first, so that a crash names its step."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    step = lambda what: log(f"PROBE step: {what}")  # noqa: E731
    step("import deep_gemm")
    dg = import_dg(args.src)
    step(f"get_num_sms -> {dg.get_num_sms()}")
    step(f"get_tma_aligned_size(1, 4) -> {dg.get_tma_aligned_size(1, 4)}")
    gen = torch.Generator(device="cuda").manual_seed(3)
    step("inputs (get_mn_major_tma_aligned_tensor on aligned scales)")
    x, w = gemm_inputs(dg, torch, 8, 1536, 4096, gen)
    y = torch.full((8, 1536), float("nan"), device="cuda", dtype=torch.bfloat16)
    step("fp8_gemm_nt m=8 n=1536 k=4096 (JIT compile)")
    t0 = time.time()
    dg.fp8_gemm_nt(x, w, y)
    torch.cuda.synchronize()
    ref = dequant(x[0], x[1], 1, 128) @ dequant(w[0], w[1], 128, 128).t()
    from deep_gemm.testing import calc_diff
    diff = float(calc_diff(y.float(), ref))
    step(f"fp8_gemm_nt done in {time.time() - t0:.1f} s, diff {diff:.1e}")
    if args.indexer:
        step("fp8_paged_mqa_logits entries=256 next_n=2 (JIT compile)")
        t0 = time.time()
        paged_call(dg, paged_inputs(torch, 256, 2, gen))
        torch.cuda.synchronize()
        step(f"fp8_paged_mqa_logits done in {time.time() - t0:.1f} s")
    log("PROBE OK" if diff < 1e-3 else "PROBE WRONG")
    return 0 if diff < 1e-3 else 1


def cmd_prewarm(args):
    import torch
    dg = import_dg(args.src)
    gen = torch.Generator(device="cuda").manual_seed(1)
    mine = [it for i, it in enumerate(items()) if i % args.parts == args.part]
    for it in mine:
        t0 = time.time()
        try:
            if it[0] == "gemm":
                _, name, n, k, m = it
                x, w = gemm_inputs(dg, torch, m, n, k, gen, random_data=False)
                y = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)
                dg.fp8_gemm_nt(x, w, y)
            else:
                _, name, entries, next_n, _ = it
                paged_call(dg, paged_inputs(torch, entries, next_n, gen))
            torch.cuda.synchronize()
            log(f"PREWARM part {args.part} {it[0]} {name} m={it[4]} {time.time() - t0:.1f} s")
        except Exception as e:  # noqa: BLE001 - logged, the bench reports what is missing
            log(f"PREWARM part {args.part} {it[0]} {it[1]} m={it[4]} FAILED after {time.time() - t0:.1f} s: {e!r}")


# ---------------------------------------------------------------- bench

class Timer:
    def __init__(self, torch):
        self.torch = torch
        self.flush = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)

    def graph(self, fn, reps=REPS):
        torch = self.torch
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()  # warm on the capture stream
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                fn()
        g.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) * 1e3 / reps)
        del g
        return statistics.median(times)

    def cold_b2b(self, fn):
        fill = lambda: self.flush.fill_(7)  # noqa: E731
        b2b = self.graph(fn)
        flushes = self.graph(fill)
        pairs = self.graph(lambda: (fill(), fn()))
        return pairs - flushes, b2b


def copy_rate(torch):
    n = 1 << 30
    src = torch.empty(n, device="cuda", dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e-3)
    del src, dst
    return 2 * n / statistics.median(ts) / 1e9


def cmd_bench(args):
    import torch
    t_start = time.time()
    deadline = t_start + args.budget
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    dg = import_dg(args.src)
    import_s = time.time() - t0
    from deep_gemm.testing import calc_diff
    os.makedirs(args.out, exist_ok=True)
    res = {
        "device": torch.cuda.get_device_name(), "sms": dg.get_num_sms(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "deepgemm_version": getattr(dg, "__version__", "?"), "deepgemm_commit": os.environ.get("DG_COMMIT", "?"),
        "build_s": os.environ.get("DG_BUILD_S"), "prewarm_s": os.environ.get("DG_PREWARM_S"),
        "import_s": round(import_s, 2), "jit": "NVRTC" if os.environ.get("DG_JIT_USE_NVRTC") == "1" else "NVCC",
        "reps": REPS, "gemm": [], "indexer": [], "skipped": [],
    }
    jpath, tpath = os.path.join(args.out, "deepgemm.json"), os.path.join(args.out, "deepgemm.txt")

    def save():
        with open(jpath, "w") as f:
            json.dump(res, f, indent=1)
        with open(tpath, "w") as f:
            f.write(table(res))

    res["copy_gbps"] = round(copy_rate(torch), 1)
    log(f"device {res['device']} ({res['sms']} SMs), torch {res['torch']}, copy {res['copy_gbps']} GB/s (read + write of 1 GiB)")
    save()
    timer = Timer(torch)
    gen = torch.Generator(device="cuda").manual_seed(25)
    weights = {}
    ok_all = True
    for it in items():
        left = deadline - time.time()
        if left < 6:
            res["skipped"].append(f"{it[0]} {it[1]} m={it[4]}: out of time")
            continue
        if it[0] == "gemm":
            _, name, n, k, m = it
            t0 = time.time()
            if name not in weights:
                weights.clear()
                torch.cuda.empty_cache()
                _, w = gemm_inputs(dg, torch, 1, n, k, gen)
                weights[name] = (w, dequant(w[0], w[1], 128, 128))
            w, wref = weights[name]
            x, _ = gemm_inputs(dg, torch, m, 128, k, gen)
            y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            dg.fp8_gemm_nt(x, w, y)  # first call: JIT (a cache hit after prewarm)
            torch.cuda.synchronize()
            first_s = time.time() - t0
            ref = dequant(x[0], x[1], 1, 128) @ wref.t()
            diff = float(calc_diff(y.float(), ref))
            maxerr = float((y.float() - ref).abs().max() / ref.abs().max())
            ok = diff < 1e-3 and maxerr < 0.02 and not torch.isnan(y).any().item()
            ok_all &= ok
            del ref
            cold, b2b = timer.cold_b2b(lambda: dg.fp8_gemm_nt(x, w, y))
            gbps = n * k / (cold * 1e-6) / 1e9
            r = dict(shape=name, n=n, k=k, m=m, cold_us=round(cold, 2), b2b_us=round(b2b, 2),
                     cold_gbps=round(gbps, 0), pct_copy=round(100 * gbps / res["copy_gbps"], 1),
                     floor_us=round(n * k / (res["copy_gbps"] * 1e3), 2),
                     diff=diff, maxerr=maxerr, ok=ok, setup_s=round(first_s, 1))
            res["gemm"].append(r)
            log(f"DG {name:14s} m={m:4d} cold {cold:8.2f} us  b2b {b2b:8.2f} us  cold {gbps:5.0f} GB/s "
                f"({r['pct_copy']:5.1f}% of copy)  diff {diff:.1e} maxerr {maxerr:.1e} {'ok' if ok else 'WRONG'} "
                f"(setup {first_s:.1f} s)")
        else:
            _, name, entries, next_n, _ = it
            weights.clear()
            torch.cuda.empty_cache()
            t0 = time.time()
            p = paged_inputs(torch, entries, next_n, gen)
            logits = paged_call(dg, p)
            torch.cuda.synchronize()
            first_s = time.time() - t0
            # Reference for one row of each of three sequences (float32, the dequantized keys).
            diffs = []
            for seq in (0, IDX_SEQS // 2, IDX_SEQS - 1):
                row_b = seq * p["groups"]
                blocks = p["table"][row_b].long()
                kq = p["kq"].view(torch.uint8)[blocks].view(torch.float8_e4m3fn)  # gathered as bytes
                kf = (kq.float() * p["scale"][blocks]).reshape(-1, IDX_DIM)[:entries]
                for j in range(next_n):
                    qf = p["q"][row_b, j].float()
                    s = torch.relu(qf @ kf.t()) * p["weights"][row_b * next_n + j][:, None]
                    ref = s.sum(0)
                    got = logits[row_b * next_n + j, :entries].float()
                    diffs.append(float(calc_diff(got, ref)))
            diff = max(diffs)
            ok = diff < 1e-3
            ok_all &= ok
            meta = dg.get_paged_mqa_logits_metadata(p["lens"], IDX_BLOCK, dg.get_num_sms())
            call = lambda: dg.fp8_paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"],  # noqa: E731
                                                   p["table"], meta, p["max_len"], False)
            cold, b2b = timer.cold_b2b(call)
            meta_cold, meta_b2b = timer.cold_b2b(lambda: dg.get_paged_mqa_logits_metadata(p["lens"], IDX_BLOCK, dg.get_num_sms()))
            key_bytes = IDX_SEQS * entries * (IDX_DIM + 4)
            flops = 2 * IDX_SEQS * IDX_TOKENS * entries * IDX_HEADS * IDX_DIM
            r = dict(case=name, entries=entries, context_tokens=4 * entries, next_n=next_n, rows=p["batch"],
                     cold_us=round(cold, 2), b2b_us=round(b2b, 2), meta_cold_us=round(meta_cold, 2),
                     meta_b2b_us=round(meta_b2b, 2), key_bytes=key_bytes,
                     key_floor_us=round(key_bytes / (res["copy_gbps"] * 1e3), 2),
                     tflops_cold=round(flops / (cold * 1e-6) / 1e12, 1), diff=diff, ok=ok, setup_s=round(first_s, 1))
            res["indexer"].append(r)
            log(f"DG indexer {name:12s} rows {p['batch']:3d} cold {cold:8.2f} us  b2b {b2b:8.2f} us  metadata "
                f"{meta_cold:6.2f} / {meta_b2b:6.2f} us  keys {key_bytes / 1e6:.1f} MB (floor {r['key_floor_us']} us)  "
                f"{r['tflops_cold']} TFLOP/s  diff {diff:.1e} {'ok' if ok else 'WRONG'} (setup {first_s:.1f} s)")
            del p, logits
        save()
    res["ok"] = ok_all
    res["bench_s"] = round(time.time() - t_start, 1)
    save()
    log(table(res))
    log(f"bench: {len(res['gemm'])} GEMMs, {len(res['indexer'])} indexer cases, {len(res['skipped'])} skipped, "
        f"{'all checks pass' if ok_all else 'SOME CHECKS FAILED'}, {res['bench_s']} s")
    return 0 if ok_all else 1


def table(res):
    lines = [f"DeepGEMM {res['deepgemm_version']} ({res['deepgemm_commit']}) on {res['device']}, torch {res['torch']}, "
             f"JIT {res['jit']}; copy {res.get('copy_gbps')} GB/s (read + write); build {res['build_s']} s, "
             f"prewarm {res['prewarm_s']} s; us a call, median of 5 graph replays of {res['reps']}",
             f"{'GEMM':14s} {'N':>6s} {'K':>5s} {'M':>4s} {'cold us':>9s} {'b2b us':>9s} {'GB/s':>6s} {'% copy':>6s} "
             f"{'floor us':>8s}  check"]
    order = {name: i for i, (name, _, _) in enumerate(GEMMS)}
    for r in sorted(res["gemm"], key=lambda r: (order[r["shape"]], r["m"])):
        lines.append(f"{r['shape']:14s} {r['n']:6d} {r['k']:5d} {r['m']:4d} {r['cold_us']:9.2f} {r['b2b_us']:9.2f} "
                     f"{r['cold_gbps']:6.0f} {r['pct_copy']:6.1f} {r['floor_us']:8.2f}  "
                     f"{'ok' if r['ok'] else 'WRONG'} {r['diff']:.1e}")
    if res["indexer"]:
        lines.append(f"{'indexer':14s} {'entries':>7s} {'nn':>2s} {'rows':>4s} {'cold us':>9s} {'b2b us':>9s} "
                     f"{'meta us':>8s} {'key MB':>7s} {'floor us':>8s} {'TFLOP/s':>7s}  check")
        for r in sorted(res["indexer"], key=lambda r: (-r["next_n"], r["entries"])):
            lines.append(f"{'paged-mqa':14s} {r['entries']:7d} {r['next_n']:2d} {r['rows']:4d} {r['cold_us']:9.2f} "
                         f"{r['b2b_us']:9.2f} {r['meta_cold_us']:8.2f} {r['key_bytes'] / 1e6:7.1f} {r['key_floor_us']:8.2f} "
                         f"{r['tflops_cold']:7.1f}  {'ok' if r['ok'] else 'WRONG'} {r['diff']:.1e}")
    for s in res["skipped"]:
        lines.append(f"skipped: {s}")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--src", required=True)
    b.add_argument("--opt", default="-O3")
    p = sub.add_parser("prewarm")
    p.add_argument("--src", required=True)
    p.add_argument("--part", type=int, required=True)
    p.add_argument("--parts", type=int, required=True)
    q = sub.add_parser("probe")
    q.add_argument("--src", required=True)
    q.add_argument("--indexer", action="store_true")
    r = sub.add_parser("bench")
    r.add_argument("--src", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--budget", type=float, default=60)
    a = ap.parse_args()
    if a.cmd == "build":
        cmd_build(a)
    elif a.cmd == "probe":
        sys.exit(cmd_probe(a))
    elif a.cmd == "prewarm":
        cmd_prewarm(a)
    else:
        sys.exit(cmd_bench(a))


if __name__ == "__main__":
    main()
