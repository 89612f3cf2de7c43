#!/usr/bin/env python3
"""PyTorch peer of the indexer's top-k select (issue 24), as a competent user writes it.

What our select kernel does (attention/mla/cuda, topk_select5 / topk_select4n): for each query
row, the index_topk largest float32 scores of its visible entries, returned as ascending int32
entry indices. The PyTorch version: torch.topk(scores, k, sorted=False) on the float32 [rows,
keys] scores, then torch.sort of the int64 indices and a cast to int32 -- captured in a CUDA graph
of REPS calls (no host launch cost), timed by CUDA events, the median of 5 replays.

Equal work, stated: at decode every row has the same visible count (the ragged counts of a batch
differ by a few entries); at prefill torch sees the whole [rows, keys] block (a causal batch's rows
see 1..keys entries, so our kernel reads about half of it): torch's figure is for the full block.
Then the whole selection (score and select) the same way, on dequantized bf16 operands (see
score_select). Prints one line per shape and writes JSON to argv[1] if given.
"""
import json
import sys

import torch

REPS = 20
SHAPES = [  # name, rows, keys, k
    ("decode b=32 MTP 3, 8K", 128, 2048, 512),
    ("decode b=32 MTP 3, 64K", 128, 16384, 512),
    ("decode b=32 MTP 3, 128K", 128, 32768, 512),
    ("decode b=32 MTP 3, 1M", 128, 262144, 512),
    ("decode b=32 MTP 3, 64K, index_topk 1024", 128, 16384, 1024),
    ("prefill 4K (full block)", 4096, 1024, 512),
    ("prefill 16K (full block)", 16384, 4096, 1024),
]


def select(scores, k):
    idx = torch.topk(scores, k, dim=-1, sorted=False).indices
    return torch.sort(idx, dim=-1).values.to(torch.int32)


SCORE_SHAPES = [  # name, sequences, rows a sequence, entries, k
    ("decode b=32 MTP 3, 8K", 32, 4, 2048, 512),
    ("decode b=32 MTP 3, 64K", 32, 4, 16384, 512),
    ("decode b=32 MTP 3, 128K", 32, 4, 32768, 512),
]


def score_select(q, w, keys, k):
    """The whole selection as a PyTorch user writes it: q [B, R, 64, 128] bf16 (dequantized
    query heads), w [B, R, 64] float32 head weights, keys [B, N, 128] bf16 (each sequence's
    dequantized indexer keys, contiguous: no page table); score = sum_h w * relu(q_h . k)."""
    dots = torch.einsum("brhd,bnd->brhn", q, keys).float()  # bf16 tensor cores, float32 out
    scores = (torch.relu(dots) * w.unsqueeze(-1)).sum(dim=2)  # [B, R, N]
    return select(scores.flatten(0, 1), k)


def main():
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    out = []
    for name, rows, keys, k in SHAPES:
        g = torch.Generator(device=dev).manual_seed(rows * 7 + keys)
        scores = torch.randn(rows, keys, device=dev, generator=g, dtype=torch.float32)
        ref = select(scores, k)  # warm-up (and the allocator's pools) outside the capture
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                select(scores, k)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(REPS):
                res = select(scores, k)
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / REPS)
        times.sort()
        ok = torch.equal(res, ref)
        us = times[len(times) // 2]
        print(f"torch select  {name:44s} rows {rows:6d} keys {keys:7d} k {k:5d}  {us:9.2f} us (min {times[0]:.2f})  same indices as eager: {ok}")
        out.append({"name": name, "rows": rows, "keys": keys, "k": k, "us_median": us, "us_min": times[0], "check": ok})
        del graph
    # The score too (equal work but for the numerics: bf16 dequantized operands, float32 sums in
    # cuBLAS's order, 256 bytes a key read instead of our 68 of MXFP4, no block table).
    for name, seqs, rows, n, k in SCORE_SHAPES:
        g = torch.Generator(device=dev).manual_seed(seqs * 131 + n)
        q = torch.randn(seqs, rows, 64, 128, device=dev, generator=g).to(torch.bfloat16)
        w = torch.randn(seqs, rows, 64, device=dev, generator=g)
        keys = torch.randn(seqs, n, 128, device=dev, generator=g).to(torch.bfloat16)
        ref = score_select(q, w, keys, k)
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                score_select(q, w, keys, k)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(REPS):
                res = score_select(q, w, keys, k)
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / REPS)
        times.sort()
        us = times[len(times) // 2]
        ok = torch.equal(res, ref)
        print(f"torch score+select {name:39s} rows {seqs * rows:6d} keys {n:7d} k {k:5d}  {us:9.2f} us (min {times[0]:.2f})  same indices as eager: {ok}")
        out.append({"name": "score+select " + name, "rows": seqs * rows, "keys": n, "k": k, "us_median": us, "us_min": times[0], "check": ok})
        del graph
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"torch": torch.__version__, "reps": REPS, "results": out}, f, indent=1)


if __name__ == "__main__":
    main()
