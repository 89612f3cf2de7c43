#!/usr/bin/env python3
"""PyTorch peers of the prologue kernels, and their benchmark.

The two functions kv_prologue and q_prologue do the work of our KV and Q kernels (DESIGN.md
sections 2-5) in plain PyTorch, the way a PyTorch serving stack writes it: RMSNorm in float32,
GPT-J RoPE on the trailing 64 values, the quantization of each cache format, and an index_put
of the bytes into the paged uint8 cache. They are timed eager and under torch.compile over the
shapes of issue 5 (one kernel at a time).

The decode iteration and the layer-graph sweep use the stronger peer of issue 8, layer_prologue:
one function doing a whole layer's KV and Q job, written as a competent PyTorch user writes it
for a serving loop. Everything that does not change between layers is hoisted out and done once
per iteration (iteration_plan: the RoPE rows gathered at the batch's positions, the byte offsets
of every token's cache row and scales); the function has no Python work per token, no .item()
and no data-dependent control flow, so torch.compile(fullgraph=True, dynamic=False) turns it into
a few fused Triton kernels, and every layer of the iteration (each with its own inputs, weight,
cache pool and Q output) is captured in one CUDA graph.

Run: python3 bench/peers.py --out bench-peers.json   (see --help; the shapes default to issue 5's)

The module is also the library that bench/check_peers.py uses: the byte decoders of the three cache
formats and the per-element tolerance live here so that both scripts read the layouts one way.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch

# Dimensions of one DSv4 MLA row (DESIGN.md section 2).
HEAD_DIM = 512
NOPE_DIM = 448
ROPE_DIM = 64
ROPE_PAIRS = ROPE_DIM // 2
GROUP_SIZE = 64
NUM_GROUPS = NOPE_DIM // GROUP_SIZE
EPS = 1e-6
E4M3_MAX = 448.0
UE8M0_FLOOR = 1e-4

# fp8_ue8m0 token layout: 576 value bytes (448 e4m3 + 64 bf16) in the values region, 8 scale
# bytes (7 written) in the scales region after the P value rows of the page.
UE8M0_VALUE_BYTES = NOPE_DIM + 2 * ROPE_DIM
UE8M0_SCALE_BYTES = 8
UE8M0_TOKEN_BYTES = UE8M0_VALUE_BYTES + UE8M0_SCALE_BYTES

FP8_UE8M0 = "fp8_ue8m0"
BF16 = "bf16"
FP8_PERTENSOR = "fp8_pertensor"
FORMATS = (FP8_UE8M0, BF16, FP8_PERTENSOR)

FP8 = getattr(torch, "float8_e4m3fn", None)

# DSv4 model dims (DESIGN.md section 2) and the RoPE constants.
MODELS = {
    "flash": {"heads": 64, "q_lora_rank": 1024, "layers": 43},
    "pro": {"heads": 128, "q_lora_rank": 1536, "layers": 61},
}
ROPE_THETA = 10000.0
COMPRESS_ROPE_THETA = 160000.0
YARN_FACTOR = 16.0
YARN_ORIGINAL_MAX_POS = 65536
YARN_BETA_FAST = 32.0
YARN_BETA_SLOW = 1.0

# Generation sequences have random lengths up to this many tokens (issue 5).
MAX_GEN_KV_LEN = 4096


def page_bytes(fmt: str, page_size: int) -> int:
    """Bytes of one cache page of the format (DESIGN.md section 3)."""
    if fmt == FP8_UE8M0:
        return -(-UE8M0_TOKEN_BYTES * page_size // UE8M0_VALUE_BYTES) * UE8M0_VALUE_BYTES
    if fmt == BF16:
        return 2 * HEAD_DIM * page_size
    if fmt == FP8_PERTENSOR:
        return HEAD_DIM * page_size
    raise ValueError(f"cache format {fmt!r}: want one of {', '.join(FORMATS)}")


def token_bytes(fmt: str) -> int:
    """Cache bytes one token writes."""
    return {FP8_UE8M0: UE8M0_TOKEN_BYTES - 1, BF16: 2 * HEAD_DIM, FP8_PERTENSOR: HEAD_DIM}[fmt]


# ---------------------------------------------------------------------------------------------
# The peers.


def _is_compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    is_compiling = getattr(compiler, "is_compiling", None)
    return bool(is_compiling()) if is_compiling is not None else False


def _to_e4m3(v: torch.Tensor) -> torch.Tensor:
    """float32 -> float8_e4m3fn, saturating like cvt.rn.satfinite (PyTorch's cast gives NaN past 448)."""
    return v.clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def _fp8_bytes(q: torch.Tensor) -> torch.Tensor:
    """The bytes of an e4m3 tensor, as uint8 of the same shape."""
    return q.view(torch.uint8)


def _bf16_bytes(t: torch.Tensor) -> torch.Tensor:
    """Little-endian bytes of a bf16 tensor whose last dim has stride 1: (..., n) -> (..., 2n) uint8."""
    if _is_compiling():
        # Inductor does not lower a bitcast between dtypes of different widths; shifts fuse.
        u = t.contiguous().view(torch.int16).to(torch.int32)
        lo = (u & 0xFF).to(torch.uint8)
        hi = ((u >> 8) & 0xFF).to(torch.uint8)
        return torch.stack((lo, hi), dim=-1).flatten(-2)
    return t.view(torch.uint8)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """bf16(x * rsqrt(mean(x^2) + eps) [* weight]) over the last dim, computed in float32."""
    xf = x.float()
    r = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + EPS)
    y = xf * r
    if weight is not None:
        y = y * weight
    return y.to(torch.bfloat16)


def _rope_tail_(y: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotates y[..., 448:] in place as GPT-J pairs (2k, 2k+1) by cos_sin[position, k]; y is
    (T, 512) or (T, H, 512) bf16 and the products are rounded one by one in float32."""
    cs = cos_sin[positions]  # (T, 32, 2)
    if y.dim() == 3:
        cs = cs.unsqueeze(1)
    c = cs[..., 0]
    s = cs[..., 1]
    pairs = y[..., NOPE_DIM:].float().unflatten(-1, (ROPE_PAIRS, 2))
    y0 = pairs[..., 0]
    y1 = pairs[..., 1]
    r0 = y0 * c - y1 * s
    r1 = y0 * s + y1 * c
    y[..., NOPE_DIM:] = torch.stack((r0, r1), dim=-1).flatten(-2).to(torch.bfloat16)
    return y


def kv_prologue(latent, w, cos_sin, positions, slots, cache, fmt, page_size, kv_scale=1.0):
    """KV side of the prologue: RMSNorm(latent) * w, RoPE on the tail, quantize, store at slots.

    latent: (T, 512) bf16, may be the strided slice fused_a[:, q_lora_rank:] (not copied here).
    w: (512,) float32. cos_sin: (positions, 32, 2) float32. positions, slots: (T,) int64, slots
    distinct and inside the pool. cache: (pages, page_bytes(fmt, page_size)) uint8, contiguous.
    Returns nothing; the cache is written in place.
    """
    if latent.dim() != 2 or latent.shape[1] != HEAD_DIM:
        raise ValueError(f"latent shape {tuple(latent.shape)}: want (tokens, {HEAD_DIM})")
    if cache.dim() != 2 or cache.shape[1] != page_bytes(fmt, page_size):
        raise ValueError(
            f"cache shape {tuple(cache.shape)}: want (pages, {page_bytes(fmt, page_size)}) for {fmt}")
    y = _rms_norm(latent, w)
    _rope_tail_(y, cos_sin, positions)
    n_pages = cache.shape[0]
    if fmt == FP8_UE8M0:
        page = torch.div(slots, page_size, rounding_mode="floor")
        off = torch.remainder(slots, page_size)
        nope = y[:, :NOPE_DIM].float().unflatten(-1, (NUM_GROUPS, GROUP_SIZE))
        amax = torch.nan_to_num(nope.abs(), nan=0.0, posinf=math.inf).amax(dim=-1)
        t = amax.clamp_min(UE8M0_FLOOR) / E4M3_MAX
        # e = ceil(log2 t) as a biased exponent, read from t's bits; inv = 2^(127-e) exactly.
        bits = t.view(torch.int32)
        e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
        e = e.clamp_max(254)
        # (254 - e) << 23 is the float32 2^(127-e) for e < 254; e = 254 (an Inf in the group)
        # needs the subnormal 2^-127, bit 22. No torch.where with a scalar: graph capture safe.
        inv = (((254 - e) << 23) | ((e == 254).to(torch.int32) << 22)).view(torch.float32)
        q = _to_e4m3(nope * inv.unsqueeze(-1))
        row = torch.cat((_fp8_bytes(q).flatten(1), _bf16_bytes(y[:, NOPE_DIM:])), dim=1)
        values = cache[:, : UE8M0_VALUE_BYTES * page_size].view(n_pages, page_size, UE8M0_VALUE_BYTES)
        values.index_put_((page, off), row)
        scales = cache[:, UE8M0_VALUE_BYTES * page_size : UE8M0_TOKEN_BYTES * page_size]
        scales = scales.view(n_pages, page_size, UE8M0_SCALE_BYTES)[:, :, :NUM_GROUPS]
        scales.index_put_((page, off), e.to(torch.uint8))
    elif fmt == BF16:
        cache.view(-1, 2 * HEAD_DIM).index_put_((slots,), _bf16_bytes(y))
    elif fmt == FP8_PERTENSOR:
        q = _to_e4m3(y.float() * kv_scale)
        cache.view(-1, HEAD_DIM).index_put_((slots,), _fp8_bytes(q))
    else:
        raise ValueError(f"cache format {fmt!r}: want one of {', '.join(FORMATS)}")


def q_prologue(q, cos_sin, positions, q_scale=1.0, out_fp8=True):
    """Q side: weightless RMSNorm per (token, head), RoPE on the tail with the token's position,
    then e4m3 of y * q_scale (saturated), or bf16. q: (T, H, 512) bf16 -> (T, H, 512)."""
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q shape {tuple(q.shape)}: want (tokens, heads, {HEAD_DIM})")
    y = _rms_norm(q)
    _rope_tail_(y, cos_sin, positions)
    if not out_fp8:
        return y
    return _to_e4m3(y.float() * q_scale)


def make_kv_fn(fmt, page_size, kv_scale):
    """kv_prologue with the format and scalars bound (what torch.compile gets)."""
    def kv(latent, w, cos_sin, positions, slots, cache):
        kv_prologue(latent, w, cos_sin, positions, slots, cache, fmt, page_size, kv_scale)
    kv.__name__ = f"kv_{fmt}"
    return kv


def make_q_fn(q_scale, out_fp8=True):
    """q_prologue with the scalars bound (what torch.compile gets)."""
    def qfn(q, cos_sin, positions):
        return q_prologue(q, cos_sin, positions, q_scale, out_fp8)
    qfn.__name__ = "q_fp8" if out_fp8 else "q_bf16"
    return qfn


# ---------------------------------------------------------------------------------------------
# The stronger peer: one layer's whole job, with the per-iteration work hoisted.


def _bf16_bytes_shift(t: torch.Tensor) -> torch.Tensor:
    """_bf16_bytes by integer shifts (what Inductor compiles): (..., n) bf16 -> (..., 2n) uint8."""
    u = t.contiguous().view(torch.int16).to(torch.int32)
    lo = (u & 0xFF).to(torch.uint8)
    hi = ((u >> 8) & 0xFF).to(torch.uint8)
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def _rope_rows(y: torch.Tensor, c: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """y (..., 512) bf16 with its tail rotated as GPT-J pairs by the gathered rows c, s (..., 32)
    float32 (broadcast over heads); out of place, the products rounded one by one in float32."""
    pairs = y[..., NOPE_DIM:].float().unflatten(-1, (ROPE_PAIRS, 2))
    y0 = pairs[..., 0]
    y1 = pairs[..., 1]
    r0 = y0 * c - y1 * s
    r1 = y0 * s + y1 * c
    rot = torch.stack((r0, r1), dim=-1).flatten(-2).to(torch.bfloat16)
    return torch.cat((y[..., :NOPE_DIM], rot), dim=-1)


def row_bytes(fmt: str) -> int:
    """Bytes of one token's cache row as layer_prologue writes it (values, then scale bytes)."""
    return UE8M0_VALUE_BYTES + NUM_GROUPS if fmt == FP8_UE8M0 else token_bytes(fmt)


def iteration_plan(positions, slots, fmt, page_size, tables):
    """The per-iteration work every layer shares, done once: the (cos, sin) rows of each RoPE
    table at the tokens' positions, and the byte offsets in a layer's flat pool of each token's
    value row and (fp8_ue8m0) scale bytes. positions, slots: (T,) int64, slots >= 0 and distinct.
    tables: {kind: (positions, 32, 2) float32}. Returns {"rope": {kind: (cos, sin)}, "vbase",
    "sbase"}: cos and sin (T, 32) float32 contiguous, vbase and sbase (T,) int64."""
    rope = {}
    for kind, table in tables.items():
        rows = table[positions]
        rope[kind] = (rows[..., 0].contiguous(), rows[..., 1].contiguous())
    if fmt == FP8_UE8M0:
        pb = page_bytes(fmt, page_size)
        page = torch.div(slots, page_size, rounding_mode="floor")
        off = slots - page * page_size
        vbase = page * pb + off * UE8M0_VALUE_BYTES
        sbase = page * pb + UE8M0_VALUE_BYTES * page_size + off * UE8M0_SCALE_BYTES
    else:
        page_bytes(fmt, page_size)  # validates fmt; pages are rows of whole token rows
        vbase = slots * token_bytes(fmt)
        sbase = vbase
    return {"rope": rope, "vbase": vbase.contiguous(), "sbase": sbase.contiguous()}


def make_layer_parts(fmt, q_lora_rank, kv_scale=1.0, q_scale=1.0, out_fp8=True, shift_bytes=False):
    """The two halves of layer_prologue (make_layer_fn), for callers that run them apart, as the
    chain does (the KV side on a second stream under the wq_b GEMM): kv_part(fused, w, cos, sin,
    vbase, sbase, cache_flat) writes the cache, q_part(q, cos, sin, q_out) writes Q. Arguments as
    make_layer_fn's."""
    bf16_bytes = _bf16_bytes_shift if shift_bytes else _bf16_bytes
    width = row_bytes(fmt)
    if fmt not in FORMATS:
        raise ValueError(f"cache format {fmt!r}: want one of {', '.join(FORMATS)}")

    def kv_part(fused, w, cos, sin, vbase, sbase, cache_flat):
        # KV: RMSNorm * w, RoPE, quantize, one scatter of each token's row into the pool.
        y = _rope_rows(_rms_norm(fused[:, q_lora_rank:], w), cos, sin)
        cols = torch.arange(width, device=fused.device)
        if fmt == FP8_UE8M0:
            nope = y[:, :NOPE_DIM].float().unflatten(-1, (NUM_GROUPS, GROUP_SIZE))
            amax = torch.nan_to_num(nope.abs(), nan=0.0, posinf=math.inf).amax(dim=-1)
            t = amax.clamp_min(UE8M0_FLOOR) / E4M3_MAX
            # e = ceil(log2 t) as a biased exponent, from t's bits; inv = 2^(127-e) exactly (see
            # kv_prologue).
            bits = t.view(torch.int32)
            e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
            e = e.clamp_max(254)
            inv = (((254 - e) << 23) | ((e == 254).to(torch.int32) << 22)).view(torch.float32)
            qv = _to_e4m3(nope * inv.unsqueeze(-1)).flatten(1)
            row = torch.cat((_fp8_bytes(qv), bf16_bytes(y[:, NOPE_DIM:]), e.to(torch.uint8)), dim=1)
            idx = torch.where(cols < UE8M0_VALUE_BYTES, vbase.unsqueeze(1) + cols,
                              sbase.unsqueeze(1) + (cols - UE8M0_VALUE_BYTES))
        elif fmt == BF16:
            row = bf16_bytes(y)
            idx = vbase.unsqueeze(1) + cols
        else:
            row = _fp8_bytes(_to_e4m3(y.float() * kv_scale))
            idx = vbase.unsqueeze(1) + cols
        cache_flat.index_put_((idx,), row)

    def q_part(q, cos, sin, q_out):
        # Q: weightless RMSNorm per (token, head), RoPE at the token's rows, fp8 or bf16.
        yq = _rope_rows(_rms_norm(q), cos.unsqueeze(1), sin.unsqueeze(1))
        if out_fp8:
            q_out.copy_(_to_e4m3(yq.float() * q_scale))
        else:
            q_out.copy_(yq)

    kv_part.__name__ = f"kv_part_{fmt}"
    q_part.__name__ = f"q_part_{'fp8' if out_fp8 else 'bf16'}"
    return kv_part, q_part


def make_layer_fn(fmt, q_lora_rank, kv_scale=1.0, q_scale=1.0, out_fp8=True, shift_bytes=False):
    """layer_prologue(fused, q, w, cos, sin, vbase, sbase, cache_flat, q_out) with the format and
    scalars bound: the whole prologue of one layer, in place.

    fused: (T, q_lora_rank + 512) bf16, the fused A projection rows (the latent read in place from
    its last 512 columns). q: (T, H, 512) bf16. w: (512,) float32. cos, sin: (T, 32) float32 and
    vbase, sbase: (T,) int64 from iteration_plan. cache_flat: the layer's pool as one contiguous
    uint8 vector. q_out: (T, H, 512) float8_e4m3fn (out_fp8) or bfloat16. Every token is real (no
    padding rows). shift_bytes=True writes bf16 bytes by shifts, as torch.compile needs; the bytes
    are the same either way.
    """
    kv_part, q_part = make_layer_parts(fmt, q_lora_rank, kv_scale, q_scale, out_fp8, shift_bytes)

    def layer_prologue(fused, q, w, cos, sin, vbase, sbase, cache_flat, q_out):
        kv_part(fused, w, cos, sin, vbase, sbase, cache_flat)
        q_part(q, cos, sin, q_out)

    layer_prologue.__name__ = f"layer_{fmt}_q{'fp8' if out_fp8 else 'bf16'}"
    return layer_prologue


# ---------------------------------------------------------------------------------------------
# Decoders and the tolerance (shared with check_peers.py).


def e4m3_to_float(u8: torch.Tensor) -> torch.Tensor:
    """Decodes e4m3 bytes (uint8) to float32; 0x7F and 0xFF are NaN."""
    return u8.contiguous().view(FP8).float()


def bf16_to_float(u8: torch.Tensor) -> torch.Tensor:
    """Decodes little-endian bf16 bytes (uint8, (..., 2n)) to float32 (..., n)."""
    return u8.contiguous().view(torch.bfloat16).float()


def kv_slot_bytes(cache, slots, fmt, page_size):
    """The bytes the tokens at slots occupy: (T, value bytes) uint8, and for fp8_ue8m0 the (T, 7)
    scale bytes (else None)."""
    n_pages = cache.shape[0]
    if fmt == FP8_UE8M0:
        page = torch.div(slots, page_size, rounding_mode="floor")
        off = torch.remainder(slots, page_size)
        values = cache[:, : UE8M0_VALUE_BYTES * page_size].view(n_pages, page_size, UE8M0_VALUE_BYTES)
        scales = cache[:, UE8M0_VALUE_BYTES * page_size : UE8M0_TOKEN_BYTES * page_size]
        scales = scales.view(n_pages, page_size, UE8M0_SCALE_BYTES)
        return values[page, off], scales[page, off][:, :NUM_GROUPS]
    width = 2 * HEAD_DIM if fmt == BF16 else HEAD_DIM
    page_bytes(fmt, page_size)  # validates fmt
    return cache.reshape(-1, width)[slots], None


def kv_written_mask(cache_shape, slots, fmt, page_size, device=None) -> torch.Tensor:
    """A bool tensor shaped like the cache, True at every byte that writing slots may change."""
    mask = torch.zeros(tuple(cache_shape), dtype=torch.bool, device=device)
    true = torch.ones((), dtype=torch.bool, device=device)
    n_pages = mask.shape[0]
    if fmt == FP8_UE8M0:
        page = torch.div(slots, page_size, rounding_mode="floor")
        off = torch.remainder(slots, page_size)
        values = mask[:, : UE8M0_VALUE_BYTES * page_size].view(n_pages, page_size, UE8M0_VALUE_BYTES)
        values.index_put_((page, off), true)
        scales = mask[:, UE8M0_VALUE_BYTES * page_size : UE8M0_TOKEN_BYTES * page_size]
        scales = scales.view(n_pages, page_size, UE8M0_SCALE_BYTES)[:, :, :NUM_GROUPS]
        scales.index_put_((page, off), true)
    else:
        width = 2 * HEAD_DIM if fmt == BF16 else HEAD_DIM
        page_bytes(fmt, page_size)
        mask.view(-1, width).index_put_((slots,), true)
    return mask


class Decoded:
    """Decoded rows in float64: values (..., 512); fp8 (512,) bool: which elements are e4m3 (the
    rest bf16); step (..., 512): the e4m3 subnormal step in value units (0 for bf16 elements);
    unit: a stored e4m3 unit in value units (1 / q_scale or 1 / kv_scale for the scaled formats,
    else 1)."""

    def __init__(self, values, fp8, step, unit=1.0):
        self.values = values
        self.fp8 = fp8
        self.step = step
        self.unit = unit


def decode_kv(cache, slots, fmt, page_size, kv_scale=1.0) -> Decoded:
    """Decodes the rows at slots: e4m3 * 2^(e-127) for fp8_ue8m0 nope, bf16, or e4m3 / kv_scale."""
    values, scales = kv_slot_bytes(cache, slots, fmt, page_size)
    values = values.cpu()
    T = values.shape[0]
    if fmt == FP8_UE8M0:
        scale = torch.pow(2.0, scales.cpu().to(torch.float64) - 127.0)  # (T, 7), exact
        nope = e4m3_to_float(values[:, :NOPE_DIM]).to(torch.float64).view(T, NUM_GROUPS, GROUP_SIZE)
        nope = (nope * scale.unsqueeze(-1)).view(T, NOPE_DIM)
        rope = bf16_to_float(values[:, NOPE_DIM:]).to(torch.float64)
        step = torch.cat((scale.repeat_interleave(GROUP_SIZE, dim=1) * 2.0**-9,
                          torch.zeros(T, ROPE_DIM, dtype=torch.float64)), dim=1)
        fp8 = torch.arange(HEAD_DIM) < NOPE_DIM
        return Decoded(torch.cat((nope, rope), dim=1), fp8, step)
    if fmt == BF16:
        v = bf16_to_float(values).to(torch.float64)
        return Decoded(v, torch.zeros(HEAD_DIM, dtype=torch.bool), torch.zeros_like(v))
    v = e4m3_to_float(values).to(torch.float64) / float(kv_scale)
    return Decoded(v, torch.ones(HEAD_DIM, dtype=torch.bool), torch.full_like(v, 2.0**-9 / float(kv_scale)),
                   1.0 / float(kv_scale))


def decode_q(q_bytes, out_fp8, q_scale=1.0) -> Decoded:
    """Decodes a Q buffer given as bytes: (T, H, 512) e4m3 / q_scale, or (T, H, 1024) bf16."""
    q_bytes = q_bytes.cpu()
    if out_fp8:
        v = e4m3_to_float(q_bytes).to(torch.float64) / float(q_scale)
        return Decoded(v, torch.ones(HEAD_DIM, dtype=torch.bool), torch.full_like(v, 2.0**-9 / float(q_scale)),
                       1.0 / float(q_scale))
    v = bf16_to_float(q_bytes).to(torch.float64)
    return Decoded(v, torch.zeros(HEAD_DIM, dtype=torch.bool), torch.zeros_like(v))


def q_bytes_of(out: torch.Tensor) -> torch.Tensor:
    """The bytes of a q_prologue result: (T, H, 512) for e4m3, (T, H, 1024) for bf16."""
    if out.dtype == torch.bfloat16:
        return out.contiguous().view(torch.uint8)
    return _fp8_bytes(out)


ROPE_ALLOWANCE = 2.0**-6


def compare_decoded(a: Decoded, b: Decoded) -> dict:
    """Compares two decodings of the same rows element by element.

    An element passes when |a - b| <= quantum (+ the RoPE allowance on the rope tail), where
    quantum is one step of the element's format at the stored magnitude m = max(|a|, |b|) / unit,
    in value units: 2^(floor(log2 m) - 3) * unit for e4m3 (at least the subnormal step of the
    larger of the two scales), 2^(floor(log2 m) - 7) for bf16. (Taken at the decoded value
    instead, a one-step difference of a stored e4m3 divided by a scale that is not a power of two
    could exceed it: bytes 1.0 and 1.125 at q_scale 0.75 decode to 1.333 and 1.5, a step of 0.167
    against 0.125 at 1.5.)
    The RoPE allowance, 2^-6 of the (y0, y1) pair's magnitude, covers a one-ulp difference of the
    bf16 value before the rotation (a different RMS summation order flips a rounding now and then):
    rotated, it moves the pair by up to sqrt(2) bf16 ulps of the pair, which can be many ulps of a
    small member of the pair. NaN must sit at the same places.
    """
    x, y = a.values, b.values
    if x.shape != y.shape:
        raise ValueError(f"decoded shapes differ: {tuple(x.shape)} vs {tuple(y.shape)}")
    nan_x, nan_y = torch.isnan(x), torch.isnan(y)
    nan_mismatch = int((nan_x != nan_y).sum())
    both_nan = nan_x & nan_y
    x0 = torch.nan_to_num(x, nan=0.0)
    y0 = torch.nan_to_num(y, nan=0.0)
    m = torch.maximum(x0.abs(), y0.abs())
    unit = max(float(a.unit), float(b.unit))  # scales the e4m3 elements only
    elem_unit = torch.where(a.fp8, torch.tensor(unit, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64))
    _, exponent = torch.frexp(m / elem_unit)
    bits = torch.where(a.fp8, torch.tensor(3.0, dtype=torch.float64), torch.tensor(7.0, dtype=torch.float64))
    quantum = torch.pow(2.0, exponent.to(torch.float64) - 1.0 - bits) * elem_unit
    quantum = torch.where(m > 0, quantum, torch.zeros_like(quantum))
    quantum = torch.maximum(quantum, torch.maximum(a.step, b.step))
    # Values divided by a scale carry float64 rounding: a difference of exactly one step may
    # exceed the step by an ulp.
    quantum = quantum * (1.0 + 2.0**-40)

    def pair_norm(v):
        p = v[..., NOPE_DIM:].unflatten(-1, (ROPE_PAIRS, 2))
        return p.pow(2).sum(-1).sqrt().repeat_interleave(2, dim=-1)

    allowance = torch.zeros_like(m)
    allowance[..., NOPE_DIM:] = ROPE_ALLOWANCE * torch.maximum(pair_norm(x0), pair_norm(y0))
    diff = (x0 - y0).abs()
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    bad = (diff > quantum + allowance) | (nan_x != nan_y)
    over_quantum = diff > quantum
    rel = torch.where(m > 0, diff / torch.where(m > 0, m, torch.ones_like(m)), torch.zeros_like(m))
    quanta = torch.where(quantum > 0, diff / torch.where(quantum > 0, quantum, torch.ones_like(quantum)),
                         torch.where(diff > 0, torch.full_like(diff, math.inf), torch.zeros_like(diff)))
    result = {
        "values": int(x.numel()),
        "failed": int(bad.sum()),
        "over_one_quantum": int(over_quantum.sum()),
        "max_rel_err": float(rel.max()) if rel.numel() else 0.0,
        "max_err_quanta": float(quanta.max()) if quanta.numel() else 0.0,
        "nan_mismatch": nan_mismatch,
        "worst": None,
    }
    if bad.any():
        idx = int(torch.argmax((diff - quantum - allowance).masked_fill(~bad, -math.inf).flatten()))
        where = [int(i) for i in _unravel(idx, tuple(x.shape))]
        result["worst"] = {"index": where, "a": float(x.flatten()[idx]), "b": float(y.flatten()[idx]),
                           "tolerance": float((quantum + allowance).flatten()[idx])}
    return result


def _unravel(index, shape):
    out = []
    for n in reversed(shape):
        out.append(index % n)
        index //= n
    return tuple(reversed(out))


# ---------------------------------------------------------------------------------------------
# Inputs.


def yarn_correction_range(beta_fast, beta_slow, dim, base, original_max_positions):
    def d(rotations):
        return dim * math.log(original_max_positions / (rotations * 2 * math.pi)) / (2 * math.log(base))
    low = max(math.floor(d(beta_fast)), 0)
    high = min(math.ceil(d(beta_slow)), dim - 1)
    return low, high


def rope_table(kind: str, positions: int, device) -> torch.Tensor:
    """(positions, 32, 2) float32 (cos, sin) computed in float64 (DESIGN.md section 2)."""
    k = torch.arange(ROPE_PAIRS, dtype=torch.float64)
    if kind == "plain":
        freqs = ROPE_THETA ** (-2.0 * k / ROPE_DIM)
    elif kind == "yarn":
        base = COMPRESS_ROPE_THETA
        freqs = base ** (-2.0 * k / ROPE_DIM)
        low, high = yarn_correction_range(YARN_BETA_FAST, YARN_BETA_SLOW, ROPE_DIM, base, YARN_ORIGINAL_MAX_POS)
        if low == high:
            high += 0.001
        smooth = 1.0 - ((k - low) / (high - low)).clamp(0.0, 1.0)
        freqs = freqs / YARN_FACTOR * (1.0 - smooth) + freqs * smooth
    else:
        raise ValueError(f"rope kind {kind!r}: want plain or yarn")
    pos = torch.arange(positions, dtype=torch.float64, device=device)
    angle = pos[:, None] * freqs.to(device)[None, :]
    return torch.stack((torch.cos(angle), torch.sin(angle)), dim=-1).float().contiguous()


def layer_rope_kinds(layers: int):
    """V4's compress_ratios pattern [0,0] + [4,128]* + [4,0] cut to the layers: plain RoPE where
    the ratio is 0, YaRN elsewhere."""
    ratios = [0, 0] + [4, 128] * ((layers - 2) // 2 + 1) + [4, 0]
    return ["plain" if r == 0 else "yarn" for r in ratios[:layers]]


def random_bf16(shape, device) -> torch.Tensor:
    """Random bf16 whose magnitudes vary by powers of two per row (2^-8..2^8) and per 64 values."""
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    groups = x.view(-1, shape[-1] // GROUP_SIZE, GROUP_SIZE)
    row_exp = torch.randint(-8, 9, (groups.shape[0], 1, 1), device=device)
    group_exp = torch.randint(-3, 4, (groups.shape[0], groups.shape[1], 1), device=device)
    groups.mul_(torch.exp2((row_exp + group_exp).float()).to(torch.bfloat16))
    return x


def random_weight(device) -> torch.Tensor:
    return (torch.rand(HEAD_DIM, device=device) * 1.5 + 0.25).float()


def context_lengths(tokens: int, sequences: int):
    base, extra = divmod(tokens, sequences)
    return [base + (1 if i < extra else 0) for i in range(sequences)]


def positions_and_slots(phase, batch, mtp, tokens, page_size, n_pages, device):
    """Positions and distinct slots of one batch: generation sequences of random lengths up to
    4096 with their last 1+mtp positions, or context sequences from position 0. Every sequence's
    logical pages map to distinct random physical pages of the pool."""
    if phase == "generation":
        seq_len = 1 + mtp
        if tokens != batch * seq_len:
            raise ValueError(f"tokens {tokens}: want batch*(1+mtp) = {batch * seq_len}")
        kv_len = torch.randint(seq_len, MAX_GEN_KV_LEN + 1, (batch, 1), device=device)
        pos = kv_len - seq_len + torch.arange(seq_len, device=device)
        seq = torch.arange(batch, device=device).unsqueeze(1).expand(batch, seq_len)
        max_pages = -(-MAX_GEN_KV_LEN // page_size)
    else:
        lens = context_lengths(tokens, batch)
        pos = torch.cat([torch.arange(n, device=device) for n in lens])
        seq = torch.cat([torch.full((n,), i, dtype=torch.long, device=device) for i, n in enumerate(lens)])
        max_pages = -(-max(lens) // page_size)
    if batch * max_pages > n_pages:
        raise ValueError(f"pool of {n_pages} pages cannot hold {batch} sequences of {max_pages} pages")
    logical = seq * max_pages + torch.div(pos, page_size, rounding_mode="floor")
    physical = torch.randperm(n_pages, device=device)[logical]
    slots = physical * page_size + torch.remainder(pos, page_size)
    return pos.reshape(-1).contiguous(), slots.reshape(-1).contiguous()


def pool_pages(phase, batch, tokens, page_size, fmt, min_pool_bytes):
    if phase == "generation":
        need = batch * -(-MAX_GEN_KV_LEN // page_size)
    else:
        need = batch * -(-max(context_lengths(tokens, batch)) // page_size)
    return max(need, -(-min_pool_bytes // page_bytes(fmt, page_size)))


# ---------------------------------------------------------------------------------------------
# Timing.


# With idle starts (the default) every timed call begins on an idle GPU; --back-to-back queues
# the calls without a synchronize between them, so launch costs may hide behind earlier work.
IDLE_START = True


def time_us(fn, args_for, flush, min_reps, max_reps, target_s, warmup=3, idle_start=None):
    """Median microseconds of fn(*args_for(i)) over repetitions, with CUDA events.

    Each repetition starts on an idle GPU (after an optional L2 flush and a synchronize), so the
    time includes the launch cost of every kernel the call issues: the latency a caller sees.
    idle_start (default IDLE_START: true unless --back-to-back) False queues the repetitions
    without a synchronize, each after its flush, as cmd/bench times a graph: the launch overlaps
    the flush instead of landing in the timed span.
    """
    if idle_start is None:
        idle_start = IDLE_START
    i = 0
    for _ in range(warmup):
        fn(*args_for(i))
        i += 1
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args_for(i))
    i += 1
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = max(min_reps, min(max_reps, int(target_s / max(once, 1e-6))))
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times, pairs = [], []
    for _ in range(reps):
        args = args_for(i)
        i += 1
        if flush is not None:
            flush.zero_()
        if idle_start:
            torch.cuda.synchronize()
        start.record()
        fn(*args)
        end.record()
        if idle_start:
            end.synchronize()
            times.append(start.elapsed_time(end) * 1000.0)
        else:
            pairs.append((start, end))
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
    if not idle_start:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) * 1000.0 for s, e in pairs]
    return round(statistics.median(times), 2), reps


def graph_time(body, reps, flush=None, idle_start=None):
    """Median microseconds of one replay of a CUDA graph holding body()'s launches (time_us over
    graph.replay with reps = dict(min_reps=, max_reps=, target_s=)); body runs twice on a side
    stream first, so lazy initialization stays out of the capture. bench/engines.py times the
    engines' kernels with it too."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    torch.cuda.synchronize()
    us, _ = time_us(graph.replay, lambda i: (), flush, idle_start=idle_start, **reps)
    del graph
    return us


def _graph_count():
    try:
        from torch._dynamo.utils import counters
        return int(counters["stats"]["unique_graphs"])
    except Exception:  # counters moved: the field is informative only
        return None


def _error_text(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    text = " ".join(text.split())
    return text[:600]


# ---------------------------------------------------------------------------------------------
# Benchmark.


class Bench:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.t0 = time.perf_counter()
        self.results = []
        self.iteration = []
        self.layer_graph = []
        self.selftest = None
        self.copy_gbps = None
        self.compiled = {}
        self.compile_failures = {}
        self.l2_bytes = int(args.l2_mb * 1e6)
        self.rotate_bytes = 3 * self.l2_bytes
        self.flush = torch.empty(self.rotate_bytes // 4, dtype=torch.int32, device=self.device)
        max_ctx = max(args.ctx_tokens) if args.ctx_tokens else 0
        self.table_len = max(MAX_GEN_KV_LEN, max_ctx)
        self.tables = {k: rope_table(k, self.table_len, self.device) for k in ("plain", "yarn")}

    def elapsed(self):
        return time.perf_counter() - self.t0

    def log(self, msg):
        print(f"[{self.elapsed():7.1f}s] {msg}", flush=True)

    def over_budget(self, slack=0.0):
        return self.elapsed() > self.args.budget_s + slack

    def write(self):
        doc = {
            "device": torch.cuda.get_device_name(self.device),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(self.device))),
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "triton": _triton_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
            "page_size": self.args.page_size,
            "kv_scale": self.args.kv_scale,
            "q_scale": self.args.q_scale,
            "l2_bytes": self.l2_bytes,
            "copy_gbps": self.copy_gbps,
            "timing": ("median of CUDA-event times; "
                       + ("each repetition starts on an idle GPU" if IDLE_START else "repetitions queued back to back")
                       + "; inputs rotated over sets of >= 3x L2, or the L2 flushed before each repetition"),
            "selftest": self.selftest,
            "elapsed_s": round(self.elapsed(), 1),
            "results": self.results,
            "iteration": self.iteration,
            "layer_graph": self.layer_graph,
        }
        tmp = self.args.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.args.out)

    # -- device-to-device copy, for reference against the Go run's copy_gbps

    def measure_copy(self):
        n = 1 << 30
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        us, _ = time_us(lambda: dst.copy_(src), lambda i: (), None, 20, 20, 0.0)
        self.copy_gbps = round(2 * n / (us * 1e-6) / 1e9, 1)
        del src, dst
        self.log(f"device-to-device copy: {self.copy_gbps} GB/s (read + write of 1 GiB)")

    # -- compiled functions, one per (kernel, format), dynamic shapes

    def compiled_fn(self, kernel, fmt):
        key = (kernel, fmt)
        if key not in self.compiled:
            fn = make_kv_fn(fmt, self.args.page_size, self.args.kv_scale) if kernel == "kv" \
                else make_q_fn(self.args.q_scale, fmt == "fp8")
            self.compiled[key] = torch.compile(fn, dynamic=True)
        return self.compiled[key]

    # -- one shape of one kernel

    def run_entry(self, kernel, model, fmt, phase, batch, mtp, tokens):
        a = self.args
        dims = MODELS[model]
        H, qlr = dims["heads"], dims["q_lora_rank"]
        P = a.page_size
        entry = {"kernel": kernel, "model": model, "format": fmt, "phase": phase, "batch": batch,
                 "mtp": mtp, "tokens": tokens, "eager_us": None, "compile_us": None,
                 "compile_error": None, "eager_error": None}
        label = f"{kernel} {model} {fmt} {phase} b={batch} mtp={mtp} T={tokens}"
        if self.over_budget(a.budget_slack_s):
            entry["eager_error"] = entry["compile_error"] = f"skipped: past --budget-s {a.budget_s}"
            self.log(f"{label}: skipped (budget)")
            return entry
        table = self.tables["yarn"]
        if kernel == "kv":
            set_bytes = tokens * (2 * HEAD_DIM + 16 + token_bytes(fmt))  # latent read, cache written
        else:
            set_bytes = tokens * (H * HEAD_DIM * 3 + 8)
        n_sets = max(1, min(a.max_sets, -(-self.rotate_bytes // set_bytes)))
        flush = self.flush if n_sets * set_bytes < self.rotate_bytes else None
        entry["sets"] = n_sets
        entry["l2"] = "flush" if flush is not None else "rotate"
        cache = None
        try:
            if kernel == "kv":
                n_pages = pool_pages(phase, batch, tokens, P, fmt, a.min_pool_mb << 20)
                cache = torch.zeros(n_pages, page_bytes(fmt, P), dtype=torch.uint8, device=self.device)
                w = random_weight(self.device)
                sets = []
                for _ in range(n_sets):
                    fused = random_bf16((tokens, qlr + HEAD_DIM), self.device)
                    pos, slots = positions_and_slots(phase, batch, mtp, tokens, P, n_pages, self.device)
                    sets.append((fused[:, qlr:], pos, slots))
                eager = make_kv_fn(fmt, P, a.kv_scale)

                def args_for(i, cache_=None):
                    lat, pos, slots = sets[i % n_sets]
                    return (lat, w, table, pos, slots, cache if cache_ is None else cache_)
            else:
                sets = []
                for _ in range(n_sets):
                    q = random_bf16((tokens, H, HEAD_DIM), self.device)
                    n_pages = pool_pages(phase, batch, tokens, P, FP8_UE8M0, 0)
                    pos, _ = positions_and_slots(phase, batch, mtp, tokens, P, n_pages, self.device)
                    sets.append((q, pos))
                eager = make_q_fn(a.q_scale, fmt == "fp8")

                def args_for(i, cache_=None):
                    q, pos = sets[i % n_sets]
                    return (q, table, pos)
            torch.cuda.synchronize()
        except Exception as e:  # out of memory or a bad shape: record and go on
            entry["eager_error"] = entry["compile_error"] = "inputs: " + _error_text(e)
            self.log(f"{label}: inputs failed: {entry['eager_error']}")
            return entry

        try:
            entry["eager_us"], entry["eager_reps"] = time_us(
                eager, args_for, flush, a.min_reps, a.max_reps, a.target_s)
        except Exception as e:
            entry["eager_error"] = _error_text(e)

        if a.no_compile:
            entry["compile_error"] = "not run (--no-compile)"
        elif self.over_budget():
            entry["compile_error"] = f"skipped: past --budget-s {a.budget_s}"
        elif self.compile_failures.get((kernel, fmt), 0) >= 2:
            entry["compile_error"] = "skipped after two compile failures of this kernel"
        else:
            self._run_compiled(entry, kernel, fmt, eager, args_for, cache, flush)

        self.log(f"{label}: eager {_fmt_us(entry['eager_us'])}, compile {_fmt_us(entry['compile_us'])}"
                 + (f" ({entry['compile_error']})" if entry["compile_error"] else "")
                 + (f" [eager error: {entry['eager_error']}]" if entry["eager_error"] else ""))
        return entry

    def _run_compiled(self, entry, kernel, fmt, eager, args_for, cache, flush):
        a = self.args
        graphs_before = _graph_count()
        try:
            compiled = self.compiled_fn(kernel, fmt)
            # The first call compiles (or reuses); it runs on set 0 beside eager so that the
            # two outputs can be compared byte for byte.
            if kernel == "kv":
                cache_e, cache_c = cache.clone(), cache.clone()
                eager(*args_for(0, cache_e))
                t0 = time.perf_counter()
                compiled(*args_for(0, cache_c))
                torch.cuda.synchronize()
                entry["compile_s"] = round(time.perf_counter() - t0, 2)
                entry["compile_diff_bytes"] = int((cache_e != cache_c).sum())
                del cache_e, cache_c
            else:
                out_e = q_bytes_of(eager(*args_for(0)))
                t0 = time.perf_counter()
                out_c = q_bytes_of(compiled(*args_for(0)))
                torch.cuda.synchronize()
                entry["compile_s"] = round(time.perf_counter() - t0, 2)
                entry["compile_diff_bytes"] = int((out_e != out_c).sum())
                del out_e, out_c
            entry["compile_us"], entry["compile_reps"] = time_us(
                compiled, args_for, flush, a.min_reps, a.max_reps, a.target_s)
        except Exception as e:
            entry["compile_error"] = _error_text(e)
            self.compile_failures[(kernel, fmt)] = self.compile_failures.get((kernel, fmt), 0) + 1
            if a.verbose:
                traceback.print_exc()
        graphs_after = _graph_count()
        if graphs_before is not None and graphs_after is not None:
            entry["compile_new_graphs"] = graphs_after - graphs_before

    # -- a whole decode iteration, and the layer-graph sweep (the stronger peer)

    def layer_fn(self, q_format, compiled):
        """layer_prologue for the fp8_ue8m0 cache and q_format, eager or torch.compile'd (one
        compiled object per configuration; it specializes to each shape it meets)."""
        a = self.args
        key = ("layer", q_format, compiled)
        if key not in self.compiled:
            def build(qlr):
                return make_layer_fn(FP8_UE8M0, qlr, a.kv_scale, a.q_scale, q_format == "fp8", shift_bytes=compiled)
            if not compiled:
                self.compiled[key] = build
            else:
                cache = {}

                def compiled_for(qlr):
                    # q_lora_rank is a Python constant of the function: one compiled object per
                    # model, each specialized (dynamic=False) to the shapes it is called with.
                    if qlr not in cache:
                        cache[qlr] = torch.compile(build(qlr), fullgraph=True, dynamic=False,
                                                   mode=None if a.compile_mode == "default" else a.compile_mode)
                    return cache[qlr]
                self.compiled[key] = compiled_for
        return self.compiled[key]

    def _layer_inputs(self, model, batch, mtp, q_format):
        """Every layer's own inputs for one decode iteration (fused A rows, Q, weight, fp8_ue8m0
        pool, Q output), the batch's positions and slots, and the plan every layer shares."""
        a = self.args
        dims = MODELS[model]
        H, qlr, L = dims["heads"], dims["q_lora_rank"], dims["layers"]
        P = a.page_size
        T = batch * (1 + mtp)
        n_pages = batch * -(-MAX_GEN_KV_LEN // P)
        pb = page_bytes(FP8_UE8M0, P)
        qdt = FP8 if q_format == "fp8" else torch.bfloat16
        need = L * (T * (qlr + HEAD_DIM) * 2 + T * H * HEAD_DIM * (2 + (1 if q_format == "fp8" else 2)) + n_pages * pb)
        if need > a.graph_mem_gb * 1e9:
            raise RuntimeError(f"{L} layers of inputs need {need / 1e9:.1f} GB, over --graph-mem-gb {a.graph_mem_gb}")
        pos, slots = positions_and_slots("generation", batch, mtp, T, P, n_pages, self.device)
        kinds = layer_rope_kinds(L)
        layers = []
        for l in range(L):
            layers.append({
                "fused": random_bf16((T, qlr + HEAD_DIM), self.device),
                "q": random_bf16((T, H, HEAD_DIM), self.device),
                "w": random_weight(self.device),
                "kind": kinds[l],
                "cache": torch.zeros(n_pages * pb, dtype=torch.uint8, device=self.device),
                "q_out": torch.empty((T, H, HEAD_DIM), dtype=qdt, device=self.device),
            })
        torch.cuda.synchronize()
        return {"layers": layers, "pos": pos, "slots": slots, "qlr": qlr, "L": L, "T": T}

    def _layer_step(self, inputs, fn):
        """step(): the iteration's shared plan once, then every layer through fn."""
        P = self.args.page_size
        tables = {k: self.tables[k] for k in ("plain", "yarn")}
        layers, pos, slots = inputs["layers"], inputs["pos"], inputs["slots"]

        def step():
            plan = iteration_plan(pos, slots, FP8_UE8M0, P, tables)
            vbase, sbase = plan["vbase"], plan["sbase"]
            for layer in layers:
                cos, sin = plan["rope"][layer["kind"]]
                fn(layer["fused"], layer["q"], layer["w"], cos, sin, vbase, sbase, layer["cache"], layer["q_out"])

        return step

    def _layer_check(self, inputs, fn, q_format):
        """Layer 0 through fn against the one-kernel-at-a-time eager peers (kv_prologue,
        q_prologue) on the same inputs: the bytes that differ (0 unless Inductor contracted a
        multiply-add; check_peers.py holds both to ours)."""
        a = self.args
        l0 = inputs["layers"][0]
        pos, slots, qlr = inputs["pos"], inputs["slots"], inputs["qlr"]
        table = self.tables[l0["kind"]]
        cache_fn, cache_ref = l0["cache"].clone(), l0["cache"].clone()
        q_fn = torch.empty_like(l0["q_out"])
        plan = iteration_plan(pos, slots, FP8_UE8M0, a.page_size, {"k": table})
        cos, sin = plan["rope"]["k"]
        fn(l0["fused"], l0["q"], l0["w"], cos, sin, plan["vbase"], plan["sbase"], cache_fn, q_fn)
        kv_prologue(l0["fused"][:, qlr:], l0["w"], table, pos, slots,
                    cache_ref.view(-1, page_bytes(FP8_UE8M0, a.page_size)), FP8_UE8M0, a.page_size, a.kv_scale)
        q_ref = q_prologue(l0["q"], table, pos, a.q_scale, q_format == "fp8")
        return {"cache_diff_bytes": int((cache_fn != cache_ref).sum()),
                "q_diff_bytes": int((q_bytes_of(q_fn) != q_bytes_of(q_ref)).sum())}

    def run_layer_graph(self, model, batch, mtp, q_format, iteration=None):
        """The stronger peer the way a server runs it: layer_prologue compiled (fullgraph,
        dynamic=False), every layer of the iteration with its own inputs captured in one CUDA
        graph, the L2 flushed before each replay, median; time per layer = total / layers. With
        iteration (an entry dict), also fills its eager, eager-graph and compiled-without-graph
        times (no flush, as our iteration is timed)."""
        a = self.args
        dims = MODELS[model]
        T = batch * (1 + mtp)
        entry = {"model": model, "phase": "generation", "batch": batch, "mtp": mtp, "tokens": T,
                 "layers": dims["layers"], "format": FP8_UE8M0, "q_format": q_format, "graph_us": None,
                 "us_per_layer": None, "compile_mode": a.compile_mode, "l2": "flush", "errors": {}}
        label = f"layer graph {model} b={batch} mtp={mtp} T={T} Q {q_format}"
        reps = dict(min_reps=a.min_reps, max_reps=a.max_reps, target_s=a.target_s)
        try:
            inputs = self._layer_inputs(model, batch, mtp, q_format)
        except Exception as e:
            entry["errors"]["inputs"] = _error_text(e)
            self.log(f"{label}: inputs failed: {entry['errors']['inputs']}")
            return entry
        eager_step = self._layer_step(inputs, self.layer_fn(q_format, False)(inputs["qlr"]))
        if iteration is not None:
            for field, body in (("eager_us", lambda: time_us(eager_step, lambda i: (), None, **reps)[0]),
                                ("graph_us", lambda: graph_time(eager_step, reps))):
                try:
                    iteration[field] = body()
                except Exception as e:
                    iteration["errors"][field] = _error_text(e)
                    if a.verbose:
                        traceback.print_exc()
        if a.no_compile:
            entry["errors"]["compile"] = "not run (--no-compile)"
            return entry
        try:
            fn = self.layer_fn(q_format, True)(inputs["qlr"])
            step = self._layer_step(inputs, fn)
            t0 = time.perf_counter()
            step()  # compiles on first use
            torch.cuda.synchronize()
            entry["compile_s"] = round(time.perf_counter() - t0, 2)
            entry["check"] = self._layer_check(inputs, fn, q_format)
            if iteration is not None:
                iteration["compile_us"], _ = time_us(step, lambda i: (), None, **reps)
                iteration["compile_graph_us"] = graph_time(step, reps)
                iteration["compile_s"] = entry["compile_s"]
                iteration["check"] = entry["check"]
            entry["graph_us"] = graph_time(step, reps, flush=self.flush)
            entry["us_per_layer"] = round(entry["graph_us"] / dims["layers"], 3)
        except Exception as e:
            entry["errors"]["compile"] = _error_text(e)
            if iteration is not None:
                iteration["errors"]["compile"] = entry["errors"]["compile"]
            if a.verbose:
                traceback.print_exc()
        self.log(f"{label}: {_fmt_us(entry['graph_us'])} in one graph, "
                 f"{_fmt_us(entry['us_per_layer'])} a layer (compile {entry.get('compile_s', 'n/a')} s, "
                 f"check {entry.get('check')})" + (f" errors {entry['errors']}" if entry["errors"] else ""))
        del inputs
        return entry

    def run_iteration(self, model):
        """One decode iteration (every layer's KV into an fp8_ue8m0 pool and fp8 Q) for iter_batch
        sequences at iter_mtp, the stronger peer: layer_prologue eager, eager in a CUDA graph,
        compiled, and compiled in a CUDA graph. Also returns the compiled graph as a layer-graph
        entry."""
        a = self.args
        dims = MODELS[model]
        b, mtp = a.iter_batch, a.iter_mtp
        T = b * (1 + mtp)
        entry = {"model": model, "batch": b, "mtp": mtp, "tokens": T, "layers": dims["layers"],
                 "format": FP8_UE8M0, "q_format": "fp8", "eager_us": None, "graph_us": None,
                 "compile_us": None, "compile_graph_us": None, "compile_mode": a.compile_mode,
                 "peer": "layer_prologue: one function per layer, per-iteration plan hoisted, "
                         "torch.compile(fullgraph=True, dynamic=False)", "errors": {}}
        self.log(f"iteration {model}: {dims['layers']} layers, b={b} mtp={mtp} ({T} tokens), "
                 f"{FP8_UE8M0} cache, fp8 Q")
        lg = self.run_layer_graph(model, b, mtp, "fp8", iteration=entry)
        if "inputs" in lg["errors"]:
            entry["errors"]["inputs"] = lg["errors"]["inputs"]
        self.log(f"iteration {model}: eager {_fmt_us(entry['eager_us'])}, graph {_fmt_us(entry['graph_us'])}, "
                 f"compile {_fmt_us(entry['compile_us'])}, compile + graph {_fmt_us(entry['compile_graph_us'])}"
                 + (f" errors {entry['errors']}" if entry["errors"] else ""))
        return entry, lg


def _fmt_us(v):
    return "n/a" if v is None else f"{v:.1f} us"


def _triton_version():
    try:
        import triton
        return triton.__version__
    except Exception:
        return None


# ---------------------------------------------------------------------------------------------
# Self-test: the peers' decoded output against a float64 model of the same computation.


def reference_rows(x, w, cos_sin, positions):
    """float64 RMSNorm (* w), bf16 rounding, RoPE in float64, bf16 rounding: (..., 512) float64."""
    x = x.to(torch.float64)
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)
    if w is not None:
        y = y * w.to(torch.float64)
    y = y.to(torch.bfloat16).to(torch.float64)
    cs = cos_sin[positions].to(torch.float64)
    if y.dim() == 3:
        cs = cs.unsqueeze(1)
    p = y[..., NOPE_DIM:].unflatten(-1, (ROPE_PAIRS, 2))
    y0, y1, c, s = p[..., 0], p[..., 1], cs[..., 0], cs[..., 1]
    rot = torch.stack((y0 * c - y1 * s, y0 * s + y1 * c), -1).flatten(-2)
    y[..., NOPE_DIM:] = rot.to(torch.bfloat16).to(torch.float64)
    return y


def reference_ue8m0(y: torch.Tensor) -> torch.Tensor:
    """UE8M0 exponent bytes (T, 7) of rows y (T, 512) float64 holding bf16 values, computed on the
    CPU in float32 as DESIGN.md section 5 says."""
    a = torch.nan_to_num(y[:, :NOPE_DIM].abs(), nan=0.0, posinf=math.inf)
    a = a.unflatten(-1, (NUM_GROUPS, GROUP_SIZE)).amax(dim=-1).float()
    a = torch.maximum(a, torch.full_like(a, UE8M0_FLOOR))
    t = a / torch.full_like(a, E4M3_MAX)
    bits = t.view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return e.clamp_max(254)


def compare_scales(a: torch.Tensor, b: torch.Tensor) -> dict:
    """UE8M0 exponent bytes of the same groups: they may differ by one, and in at most 1% of the
    groups (or one), where a one-ulp difference of the bf16 values moved a group's absolute
    maximum across a power of two."""
    d = (a.to(torch.int32) - b.to(torch.int32)).abs()
    n_diff = int((d > 0).sum())
    ok = (int(d.max()) <= 1 if d.numel() else True) and n_diff <= max(1, d.numel() // 100)
    return {"scales": int(d.numel()), "scales_differ": n_diff, "scales_ok": ok}


def selftest(device, seed=1234) -> dict:
    """Runs the peers on small inputs and checks, per format: decoded values within one quantum
    of a float64 model of the computation, and no byte outside the written slots changed."""
    torch.manual_seed(seed)
    out = {"ok": True, "cases": []}
    T, H, qlr, P = 37, 3, 64, 16
    table = rope_table("yarn", 4096, device)
    fused = random_bf16((T, qlr + HEAD_DIM), device)
    latent = fused[:, qlr:]
    w = random_weight(device)
    pos = torch.randint(0, 4096, (T,), device=device)
    for fmt in FORMATS:
        n_pages = 5
        slots = torch.randperm(n_pages * P, device=device)[:T]
        cache_in = torch.randint(0, 256, (n_pages, page_bytes(fmt, P)), dtype=torch.uint8, device=device)
        cache = cache_in.clone()
        kv_scale = 0.75 if fmt == FP8_PERTENSOR else 1.0
        kv_prologue(latent, w, table, pos, slots, cache, fmt, P, kv_scale)
        got = decode_kv(cache, slots, fmt, P, kv_scale)
        ref = reference_rows(latent.cpu(), w.cpu(), table.cpu(), pos.cpu())
        if fmt == FP8_PERTENSOR:
            ref = ref.clamp(-E4M3_MAX / kv_scale, E4M3_MAX / kv_scale)
        stats = compare_decoded(got, Decoded(ref, got.fp8, got.step, got.unit))
        if fmt == FP8_UE8M0:
            _, scales = kv_slot_bytes(cache, slots, fmt, P)
            stats.update(compare_scales(scales.cpu(), reference_ue8m0(ref)))
        mask = kv_written_mask(cache.shape, slots, fmt, P, device)
        untouched = bool(torch.equal(cache[~mask], cache_in[~mask]))
        ok = stats["failed"] == 0 and untouched and stats.get("scales_ok", True)
        out["cases"].append({"kernel": "kv", "format": fmt, "ok": ok, "untouched_ok": untouched, **stats})
        out["ok"] &= ok
    q = random_bf16((T, H, HEAD_DIM), device)
    for out_fp8 in (True, False):
        q_scale = 2.0 if out_fp8 else 1.0
        res = q_prologue(q, table, pos, q_scale, out_fp8)
        got = decode_q(q_bytes_of(res), out_fp8, q_scale)
        ref = reference_rows(q.cpu(), None, table.cpu(), pos.cpu())
        if out_fp8:
            ref = ref.clamp(-E4M3_MAX / q_scale, E4M3_MAX / q_scale)
        stats = compare_decoded(got, Decoded(ref, got.fp8, got.step, got.unit))
        ok = stats["failed"] == 0
        out["cases"].append({"kernel": "q", "format": "fp8" if out_fp8 else "bf16", "ok": ok, **stats})
        out["ok"] &= ok
    return out


# ---------------------------------------------------------------------------------------------


def _ints(text):
    return [int(v) for v in text.split(",") if v.strip()] if text else []


def _names(text, allowed, what):
    names = [v.strip() for v in text.split(",") if v.strip()]
    for n in names:
        if n not in allowed:
            raise SystemExit(f"--{what} {n!r}: want some of {', '.join(allowed)}")
    return names


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="bench-peers.json", help="JSON file to write (rewritten after every entry)")
    p.add_argument("--models", default="flash,pro")
    p.add_argument("--kernels", default="kv,q")
    p.add_argument("--formats", default=",".join(FORMATS), help="KV cache formats of the single-kernel entries")
    p.add_argument("--q-formats", default="fp8,bf16", help="Q output formats of the single-kernel entries")
    p.add_argument("--gen-batches", default="1,8,32,128,256")
    p.add_argument("--mtp", default="0,3")
    p.add_argument("--ctx-tokens", default="1024,4096,16384,65536")
    p.add_argument("--ctx-seqs", type=int, default=1, help="sequences per context batch")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--kv-scale", type=float, default=1.0)
    p.add_argument("--q-scale", type=float, default=1.0)
    p.add_argument("--iter-batch", type=int, default=32)
    p.add_argument("--iter-mtp", type=int, default=3)
    p.add_argument("--no-iteration", action="store_true")
    p.add_argument("--graph-batches", default="1,8,32,128,256",
                   help="layer-graph sweep: generation batches (every layer in one CUDA graph; 'none' skips it)")
    p.add_argument("--graph-mtp", default="3")
    p.add_argument("--graph-q-formats", default="fp8")
    p.add_argument("--graph-mem-gb", type=float, default=60.0, help="most memory one layer graph's inputs may take")
    p.add_argument("--compile-mode", default="default",
                   choices=("default", "max-autotune-no-cudagraphs"),
                   help="torch.compile mode of layer_prologue (CUDA graphs are captured by this script)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--no-selftest", action="store_true")
    p.add_argument("--min-reps", type=int, default=50)
    p.add_argument("--max-reps", type=int, default=200)
    p.add_argument("--target-s", type=float, default=0.1, help="aim for this much timed work per measurement")
    p.add_argument("--max-sets", type=int, default=8, help="input sets rotated; past it the L2 is flushed")
    p.add_argument("--l2-mb", type=float, default=60.0)
    p.add_argument("--min-pool-mb", type=int, default=256, help="least KV pool size, so writes spread out")
    p.add_argument("--budget-s", type=float, default=210.0,
                   help="past this, compile measurements are skipped; past it + slack, whole entries")
    p.add_argument("--budget-slack-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--back-to-back", action="store_true",
                   help="queue the timed calls without synchronizing between them (default: each starts on an idle GPU)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    args.models = _names(args.models, tuple(MODELS), "models")
    args.kernels = _names(args.kernels, ("kv", "q"), "kernels")
    args.formats = _names(args.formats, FORMATS, "formats")
    args.q_formats = _names(args.q_formats, ("fp8", "bf16"), "q-formats")
    args.graph_q_formats = _names(args.graph_q_formats, ("fp8", "bf16"), "graph-q-formats")
    args.graph_batches = [] if args.graph_batches == "none" else _ints(args.graph_batches)
    args.graph_mtp = _ints(args.graph_mtp)
    args.gen_batches = _ints(args.gen_batches)
    args.mtp = _ints(args.mtp)
    args.ctx_tokens = _ints(args.ctx_tokens)
    if args.page_size <= 0 or args.page_size & (args.page_size - 1):
        raise SystemExit(f"--page-size {args.page_size}: want a power of two")
    if args.ctx_seqs < 1:
        raise SystemExit(f"--ctx-seqs {args.ctx_seqs}: want at least 1")
    return args


def shapes(args):
    out = []
    for b in args.gen_batches:
        for m in args.mtp:
            out.append(("generation", b, m, b * (1 + m)))
    for t in args.ctx_tokens:
        out.append(("context", args.ctx_seqs, 0, t))
    return out


def main(argv=None):
    global IDLE_START
    args = parse_args(argv)
    IDLE_START = not args.back_to_back
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("peers.py needs a CUDA device")
    if FP8 is None:
        raise SystemExit(f"torch {torch.__version__} has no float8_e4m3fn")
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"peers: torch {torch.__version__}, triton {_triton_version()}, seed {seed}", flush=True)
    torch.manual_seed(seed)
    try:
        dynamo_config = importlib.import_module("torch._dynamo").config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, name):
                setattr(dynamo_config, name, 64)
    except Exception as e:
        print(f"note: could not raise dynamo's recompile limit: {_error_text(e)}", flush=True)

    with torch.no_grad():
        bench = Bench(args)
        bench.log(f"device {torch.cuda.get_device_name(bench.device)}")
        if not args.no_selftest:
            try:
                bench.selftest = selftest(bench.device)
                status = "ok" if bench.selftest["ok"] else "FAILED"
                bench.log(f"selftest {status}: " + "; ".join(
                    f"{c['kernel']} {c['format']}: {'ok' if c['ok'] else 'FAIL'} (max {c['max_err_quanta']:.2f} quanta)"
                    for c in bench.selftest["cases"]))
            except Exception as e:
                bench.selftest = {"ok": False, "error": _error_text(e)}
                bench.log(f"selftest FAILED: {bench.selftest['error']}")
                if args.verbose:
                    traceback.print_exc()
        torch.manual_seed(seed)
        bench.measure_copy()
        bench.write()
        # Most telling first: the iteration and the layer graphs (the stronger peer), then the
        # single kernels until the budget runs out. No failure of one measurement ends the run.
        if not args.no_iteration:
            for model in args.models:
                try:
                    entry, lg = bench.run_iteration(model)
                    bench.iteration.append(entry)
                    bench.layer_graph.append(lg)
                except Exception as e:
                    bench.iteration.append({"model": model, "batch": args.iter_batch, "mtp": args.iter_mtp,
                                            "errors": {"run": _error_text(e)}})
                    bench.log(f"iteration {model}: {_error_text(e)}")
                bench.write()
                torch.cuda.empty_cache()
        done = {(g["model"], g["batch"], g["mtp"], g["q_format"]) for g in bench.layer_graph}
        for model in args.models:
            for q_format in args.graph_q_formats:
                for mtp in args.graph_mtp:
                    for batch in args.graph_batches:
                        if (model, batch, mtp, q_format) in done:
                            continue
                        if bench.over_budget():
                            bench.log(f"layer graph {model} b={batch} mtp={mtp}: skipped (past --budget-s)")
                            continue
                        try:
                            lg = bench.run_layer_graph(model, batch, mtp, q_format)
                        except Exception as e:
                            lg = {"model": model, "phase": "generation", "batch": batch, "mtp": mtp,
                                  "tokens": batch * (1 + mtp), "q_format": q_format, "us_per_layer": None,
                                  "errors": {"run": _error_text(e)}}
                            bench.log(f"layer graph {model} b={batch} mtp={mtp}: {_error_text(e)}")
                        bench.layer_graph.append(lg)
                        bench.write()
                        torch.cuda.empty_cache()
        for model in args.models:
            for kernel in args.kernels:
                for fmt in (args.formats if kernel == "kv" else args.q_formats):
                    for phase, batch, mtp, tokens in shapes(args):
                        try:
                            entry = bench.run_entry(kernel, model, fmt, phase, batch, mtp, tokens)
                        except Exception as e:  # never lose the run to one shape
                            entry = {"kernel": kernel, "model": model, "format": fmt, "phase": phase,
                                     "batch": batch, "mtp": mtp, "tokens": tokens, "eager_us": None,
                                     "compile_us": None, "eager_error": _error_text(e),
                                     "compile_error": _error_text(e)}
                            bench.log(f"{kernel} {model} {fmt} {phase} T={tokens}: {_error_text(e)}")
                        bench.results.append(entry)
                        bench.write()
                        torch.cuda.empty_cache()
        bench.log(f"done: {len(bench.results)} entries, {len(bench.iteration)} iterations, "
                  f"{len(bench.layer_graph)} layer graphs -> {args.out}")
        bench.write()
    return 0


if __name__ == "__main__":
    sys.exit(main())
