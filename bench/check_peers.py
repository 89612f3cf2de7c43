#!/usr/bin/env python3
"""Proof of equal work: the PyTorch peers (bench/peers.py) against our kernels' output.

The Go benchmark (`cmd/bench --check-dir DIR`) writes, for a few small shapes, DIR/<name>.safetensors
with the inputs and our outputs:

  fused_a    (T, q_lora_rank+512) bf16   the latent is fused_a[:, q_lora_rank:]
  q          (T, H, 512) bf16
  kv_weight  (512,) f32
  cos_sin    (positions, 32, 2) f32
  positions  (T,) i32      slots (T,) i64 (negative: skipped)
  cache_in   (pages, page_bytes) u8      cache_out (pages, page_bytes) u8 (ours)
  q_out      (T, H, 512) u8 e4m3, or (T, H, 1024) u8 bf16 (ours)
  __metadata__: format, q_format (fp8|bf16), page_size, kv_scale, q_scale, q_lora_rank, heads

For each file this script runs the peers eagerly on a copy of cache_in with the same inputs (the
one-kernel-at-a-time kv_prologue and q_prologue, and the whole-layer layer_prologue that the
iteration and layer-graph timings use; with --compile also layer_prologue under torch.compile),
decodes both caches and both Q buffers to float, and compares them element by element. It passes
when every decoded value is within one quantum of ours (e4m3: 2^-3 of the value or one subnormal
step; bf16: one ulp), plus, on the 64 RoPE values only, 2^-6 of the rotated pair's magnitude (a
different RMS summation order may flip one bf16 rounding before the rotation); the UE8M0
exponents agree (off by one in at most 1% of the groups); no byte outside the written slots
changed, in ours or in the peer's cache; NaN sits at the same places. It prints a table and exits
1 on any failure, 2 when there is nothing to check.

  python3 bench/check_peers.py DIR [--device cuda|cpu] [--json FILE] [--compile] [--no-layer]
  python3 bench/check_peers.py --self-test      (checks the checker: cases it must pass and fail)
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import struct
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402

# safetensors dtype names (the format's spec) and torch's.
_DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
    "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
    "F64": torch.float64,
}
if peers.FP8 is not None and isinstance(peers.FP8, torch.dtype):
    _DTYPES["F8_E4M3"] = peers.FP8
_NAMES = {v: k for k, v in _DTYPES.items()}


def load_safetensors(path):
    """Reads a .safetensors file: ({name: tensor}, {metadata}). The format is small enough to read
    directly: an 8-byte little-endian header length, a JSON header, then the raw bytes."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes, too short for a safetensors header")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} past the end of the file ({len(data)} bytes)")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None) or {}
    body = memoryview(data)[8 + n :]
    tensors = {}
    for name, info in header.items():
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(f"{path}: tensor {name}: dtype {info['dtype']} not supported")
        begin, end = info["data_offsets"]
        shape = [int(d) for d in info["shape"]]
        if not 0 <= begin <= end <= len(body):
            raise ValueError(f"{path}: tensor {name}: data_offsets {info['data_offsets']} outside the data")
        raw = bytearray(body[begin:end])
        flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        numel = math.prod(shape)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != end - begin:
            raise ValueError(f"{path}: tensor {name}: shape {shape} of {info['dtype']} needs "
                             f"{numel * itemsize} bytes, has {end - begin}")
        tensors[name] = flat.view(dtype).reshape(shape).clone()
    return tensors, {str(k): str(v) for k, v in meta.items()}


def save_safetensors(path, tensors, metadata):
    """Writes a .safetensors file (used by --self-test)."""
    header, chunks, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)


def _f32(text):
    """A metadata scalar rounded to float32, as the kernels use it."""
    return float(torch.tensor(float(text), dtype=torch.float32))


class CaseError(Exception):
    pass


def _need(tensors, name, dtype, shape=None):
    t = tensors.get(name)
    if t is None:
        raise CaseError(f"tensor {name} missing")
    if t.dtype != dtype:
        raise CaseError(f"tensor {name}: dtype {t.dtype}, want {dtype}")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise CaseError(f"tensor {name}: shape {tuple(t.shape)}, want {tuple(shape)}")
    return t


def _kv_stats(ours, peer, cache_in, s_valid, fmt, P, kv_scale):
    """Compares a peer's cache with ours at the written slots and everywhere else."""
    dec_ours = peers.decode_kv(ours, s_valid, fmt, P, kv_scale)
    dec_peer = peers.decode_kv(peer, s_valid, fmt, P, kv_scale)
    stats = peers.compare_decoded(dec_ours, dec_peer)
    mask = peers.kv_written_mask(ours.shape, s_valid, fmt, P)
    stats["ours_untouched_ok"] = bool(torch.equal(ours[~mask], cache_in[~mask]))
    stats["peer_untouched_ok"] = bool(torch.equal(peer[~mask], cache_in[~mask]))
    written = int(mask.sum())
    stats["bytes_equal"] = float((ours[mask] == peer[mask]).double().mean()) if written else 1.0
    if fmt == peers.FP8_UE8M0:
        _, sc_ours = peers.kv_slot_bytes(ours, s_valid, fmt, P)
        _, sc_peer = peers.kv_slot_bytes(peer, s_valid, fmt, P)
        stats.update(peers.compare_scales(sc_ours, sc_peer))
    ok = (stats["failed"] == 0 and stats["nan_mismatch"] == 0 and stats["ours_untouched_ok"]
          and stats["peer_untouched_ok"] and stats.get("scales_ok", True))
    return ok, stats


def _q_stats(ours_q, peer_q, out_fp8, q_scale):
    """Compares a peer's Q bytes with ours, row for row."""
    dec_ours = peers.decode_q(ours_q, out_fp8, q_scale)
    dec_peer = peers.decode_q(peer_q, out_fp8, q_scale)
    stats = peers.compare_decoded(dec_ours, dec_peer)
    stats["bytes_equal"] = float((ours_q == peer_q).double().mean()) if peer_q.numel() else 1.0
    return stats["failed"] == 0 and stats["nan_mismatch"] == 0, stats


def _compiled_layer_fn(fn):
    return torch.compile(fn, fullgraph=True, dynamic=False)


def check_layer(name, tensors, meta, device, compiled=False):
    """The stronger peer (peers.make_layer_fn: the whole layer in one function, the per-iteration
    plan hoisted), eager or torch.compile'd, on the case's real rows: its cache and Q against ours."""
    fmt = meta["format"]
    q_format = meta.get("q_format", "fp8")
    out_fp8 = q_format == "fp8"
    P, qlr, heads = int(meta["page_size"]), int(meta["q_lora_rank"]), int(meta["heads"])
    kv_scale, q_scale = _f32(meta.get("kv_scale", "1")), _f32(meta.get("q_scale", "1"))
    positions = tensors["positions"].long()
    slots = tensors["slots"].long()
    T = positions.shape[0]
    valid = slots >= 0
    n = int(valid.sum())
    cache_in = tensors["cache_in"]
    ours = tensors["cache_out"]
    width = peers.HEAD_DIM if out_fp8 else 2 * peers.HEAD_DIM
    ours_q = _need(tensors, "q_out", torch.uint8, (T, heads, width))
    s_valid = slots[valid]
    plan = peers.iteration_plan(positions[valid].to(device), s_valid.to(device), fmt, P,
                                {"case": tensors["cos_sin"].to(device)})
    cos, sin = plan["rope"]["case"]
    fn = peers.make_layer_fn(fmt, qlr, kv_scale, q_scale, out_fp8, shift_bytes=compiled)
    if compiled:
        fn = _compiled_layer_fn(fn)
    cache = cache_in.to(device).clone().reshape(-1)
    q_out = torch.empty((n, heads, peers.HEAD_DIM), dtype=peers.FP8 if out_fp8 else torch.bfloat16, device=device)
    fn(tensors["fused_a"][valid].to(device), tensors["q"][valid].to(device), tensors["kv_weight"].to(device),
       cos, sin, plan["vbase"], plan["sbase"], cache, q_out)
    peer = cache.view(cache_in.shape).cpu()
    label = "layer (compiled)" if compiled else "layer"
    rows = []
    ok, stats = _kv_stats(ours, peer, cache_in, s_valid, fmt, P, kv_scale)
    rows.append({"case": name, "part": f"{label} kv", "format": fmt, "tokens": n,
                 "skipped_rows": T - n, "ok": ok, **stats})
    ok, stats = _q_stats(ours_q[valid], peers.q_bytes_of(q_out).cpu(), out_fp8, q_scale)
    rows.append({"case": name, "part": f"{label} q", "format": q_format, "tokens": n,
                 "skipped_rows": T - n, "ok": ok, **stats})
    return rows


def check_case(name, tensors, meta, device, layer=True, compiled=False):
    """Checks one file; returns a list of result rows: KV and Q of the one-kernel peers, where
    present, and (layer) both again from the whole-layer peer, eager and (compiled) compiled."""
    rows = []
    for key in ("format", "page_size", "q_lora_rank", "heads"):
        if key not in meta:
            raise CaseError(f"metadata {key} missing")
    fmt = meta["format"]
    q_format = meta.get("q_format", "fp8")
    if fmt not in peers.FORMATS:
        raise CaseError(f"metadata format {fmt!r}: want one of {', '.join(peers.FORMATS)}")
    if q_format not in ("fp8", "bf16"):
        raise CaseError(f"metadata q_format {q_format!r}: want fp8 or bf16")
    P = int(meta["page_size"])
    qlr = int(meta["q_lora_rank"])
    heads = int(meta["heads"])
    kv_scale = _f32(meta.get("kv_scale", "1"))
    q_scale = _f32(meta.get("q_scale", "1"))
    cos_sin = _need(tensors, "cos_sin", torch.float32)
    if cos_sin.dim() != 3 or tuple(cos_sin.shape[1:]) != (peers.ROPE_PAIRS, 2):
        raise CaseError(f"cos_sin shape {tuple(cos_sin.shape)}: want (positions, 32, 2)")
    positions = tensors.get("positions")
    if positions is None:
        raise CaseError("tensor positions missing")
    positions = positions.long()
    T = positions.shape[0]
    slots = tensors.get("slots")
    slots = slots.long() if slots is not None else None
    cs_dev = cos_sin.to(device)

    def in_table(rows_mask, what):
        p = positions[rows_mask]
        if p.numel() and (int(p.min()) < 0 or int(p.max()) >= cos_sin.shape[0]):
            raise CaseError(f"{what}: a position outside the RoPE table of {cos_sin.shape[0]} "
                            f"(min {int(p.min())}, max {int(p.max())})")

    if "cache_out" in tensors:
        fused = _need(tensors, "fused_a", torch.bfloat16, (T, qlr + peers.HEAD_DIM))
        w = _need(tensors, "kv_weight", torch.float32, (peers.HEAD_DIM,))
        cache_in = _need(tensors, "cache_in", torch.uint8)
        ours = _need(tensors, "cache_out", torch.uint8, tuple(cache_in.shape))
        if slots is None or tuple(slots.shape) != (T,):
            raise CaseError(f"tensor slots: want shape ({T},)")
        want_pb = peers.page_bytes(fmt, P)
        if cache_in.dim() != 2 or cache_in.shape[1] != want_pb:
            raise CaseError(f"cache_in shape {tuple(cache_in.shape)}: want (pages, {want_pb}) for {fmt}, P={P}")
        valid = slots >= 0
        s_valid = slots[valid]
        capacity = cache_in.shape[0] * P
        if s_valid.numel() and int(s_valid.max()) >= capacity:
            raise CaseError(f"slot {int(s_valid.max())} outside the pool of {capacity} slots")
        if s_valid.unique().numel() != s_valid.numel():
            raise CaseError("slots repeat: the order of the writes would decide the bytes")
        in_table(valid, "kv")
        fused_dev = fused.to(device)
        if bool(valid.all()):
            latent = fused_dev[:, qlr:]  # the strided slice, as the kernels read it
        else:
            latent = fused_dev[valid.to(device)][:, qlr:]
        peer = cache_in.to(device).clone()
        peers.kv_prologue(latent, w.to(device), cs_dev, positions[valid].to(device), s_valid.to(device),
                          peer, fmt, P, kv_scale)
        peer = peer.cpu()
        ok, stats = _kv_stats(ours, peer, cache_in, s_valid, fmt, P, kv_scale)
        rows.append({"case": name, "part": "kv", "format": fmt, "tokens": int(s_valid.numel()),
                     "skipped_rows": int((~valid).sum()), "ok": ok, **stats})

    if "q_out" in tensors:
        q = _need(tensors, "q", torch.bfloat16, (T, heads, peers.HEAD_DIM))
        out_fp8 = q_format == "fp8"
        width = peers.HEAD_DIM if out_fp8 else 2 * peers.HEAD_DIM
        ours_q = _need(tensors, "q_out", torch.uint8, (T, heads, width))
        # Padded rows (no slot, all zero in ours) are not the peers' work; check they are zero.
        zero_rows = (ours_q.reshape(T, -1) == 0).all(dim=1)
        padded = zero_rows & (slots < 0) if slots is not None else torch.zeros(T, dtype=torch.bool)
        keep = ~padded
        in_table(keep, "q")
        res = peers.q_prologue(q[keep].to(device), cs_dev, positions[keep].to(device), q_scale, out_fp8)
        peer_q = peers.q_bytes_of(res).cpu()
        ok, stats = _q_stats(ours_q[keep], peer_q, out_fp8, q_scale)
        rows.append({"case": name, "part": "q", "format": q_format, "tokens": int(keep.sum()),
                     "skipped_rows": int(padded.sum()), "ok": ok, **stats})
    if not rows:
        raise CaseError("neither cache_out nor q_out: nothing to check")
    if layer and "cache_out" in tensors and "q_out" in tensors:
        rows.extend(check_layer(name, tensors, meta, device))
        if compiled:
            rows.extend(check_layer(name, tensors, meta, device, compiled=True))
    return rows


def _cell(v, spec):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "ok" if v else "FAIL"
    return format(v, spec)


def print_table(rows, errors):
    head = ["case", "part", "format", "tokens", "values", "failed", ">1 quantum", "max rel err",
            "max err (quanta)", "bytes equal", "scales differ", "untouched", "NaN", "result"]
    table = [head]
    for r in rows:
        untouched = None
        if "ours_untouched_ok" in r:
            untouched = r["ours_untouched_ok"] and r["peer_untouched_ok"]
        table.append([
            r["case"], r["part"], r["format"], str(r["tokens"]), str(r["values"]), str(r["failed"]),
            str(r["over_one_quantum"]), _cell(r["max_rel_err"], ".3g"), _cell(r["max_err_quanta"], ".3g"),
            _cell(100 * r["bytes_equal"], ".3f") + "%",
            f"{r['scales_differ']}/{r['scales']}" if "scales" in r else "-",
            _cell(untouched, ""), "ok" if r["nan_mismatch"] == 0 else f"{r['nan_mismatch']} differ",
            "pass" if r["ok"] else "FAIL",
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for i, row in enumerate(table):
        print("  ".join(c.ljust(widths[j]) for j, c in enumerate(row)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for r in rows:
        if not r["ok"] and r.get("worst"):
            print(f"  {r['case']} {r['part']}: worst element {r['worst']}")
    for name, err in errors:
        print(f"  {name}: ERROR {err}")


def check_dir(directory, device, json_out=None, quiet=False, layer=True, compiled=False):
    """Checks every DIR/*.safetensors; returns (exit code, rows, errors)."""
    paths = sorted(glob.glob(os.path.join(directory, "*.safetensors")))
    rows, errors = [], []
    for path in paths:
        name = os.path.splitext(os.path.basename(path))[0]
        try:
            tensors, meta = load_safetensors(path)
            with torch.no_grad():
                rows.extend(check_case(name, tensors, meta, device, layer, compiled))
        except Exception as e:  # a malformed file or a failed run is a failed case, not a crash
            errors.append((name, f"{type(e).__name__}: {e}"))
    if not quiet:
        print_table(rows, errors)
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"rows": rows, "errors": [{"case": n, "error": e} for n, e in errors]}, f, indent=1)
    if not paths:
        if not quiet:
            print(f"no .safetensors files in {directory}")
        return 2, rows, errors
    failed = errors or any(not r["ok"] for r in rows)
    if not quiet:
        n_ok = sum(r["ok"] for r in rows)
        print(f"{n_ok} passed, {len(rows) - n_ok + len(errors)} failed")
    return (1 if failed else 0), rows, errors


# ---------------------------------------------------------------------------------------------
# Self-test: cases built from the peers themselves, which must pass, and corrupted copies,
# which must fail.


def _rms_norm_f64(x, weight=None):
    """RMSNorm in float64: a different rounding path than the peers' float32 one, standing in for
    our kernels' canonical summation order."""
    xd = x.double()
    y = xd * torch.rsqrt(xd.pow(2).mean(dim=-1, keepdim=True) + peers.EPS).float().double()
    if weight is not None:
        y = y.float() * weight
    return y.to(torch.bfloat16)


def _make_case(fmt, q_format, device, seed, T=19, H=4, other_rounding=False):
    """A case whose 'ours' outputs come from the peers themselves, or, with other_rounding, from the
    peers with a float64 RMSNorm (so that some bf16 roundings differ, as they may from ours)."""
    torch.manual_seed(seed)
    qlr, P = 64, 16
    n_pages = -(-T // P) + 2
    fused = peers.random_bf16((T, qlr + peers.HEAD_DIM), device)
    q = peers.random_bf16((T, H, peers.HEAD_DIM), device)
    w = peers.random_weight(device)
    cos_sin = peers.rope_table("yarn", 2048, device)
    positions = torch.randint(0, 2048, (T,), device=device)
    slots = torch.randperm(n_pages * P, device=device)[:T]
    slots[3] = -1
    slots[11] = -1
    valid = slots >= 0
    kv_scale = 0.5 if fmt == peers.FP8_PERTENSOR else 1.0
    q_scale = 1.5 if q_format == "fp8" else 1.0
    cache_in = torch.randint(0, 256, (n_pages, peers.page_bytes(fmt, P)), dtype=torch.uint8, device=device)
    cache_out = cache_in.clone()
    saved = peers._rms_norm
    if other_rounding:
        peers._rms_norm = _rms_norm_f64
    try:
        peers.kv_prologue(fused[valid][:, qlr:], w, cos_sin, positions[valid], slots[valid], cache_out, fmt, P,
                          kv_scale)
        q_out = peers.q_bytes_of(peers.q_prologue(q, cos_sin, positions, q_scale, q_format == "fp8")).clone()
    finally:
        peers._rms_norm = saved
    q_out[~valid] = 0  # padded rows
    tensors = {"fused_a": fused, "q": q, "kv_weight": w, "cos_sin": cos_sin, "positions": positions.to(torch.int32),
               "slots": slots, "cache_in": cache_in, "cache_out": cache_out, "q_out": q_out}
    meta = {"format": fmt, "q_format": q_format, "page_size": P, "kv_scale": kv_scale, "q_scale": q_scale,
            "q_lora_rank": qlr, "heads": H}
    return {k: v.cpu() for k, v in tensors.items()}, meta


def _corruptions(tensors, meta):
    """(name, tensors) copies that a correct checker must fail."""
    fmt, P = meta["format"], int(meta["page_size"])
    slots = tensors["slots"]
    first = int(slots[slots >= 0][0])
    out = []

    def with_cache(mutate):
        t = dict(tensors)
        t["cache_out"] = tensors["cache_out"].clone()
        mutate(t["cache_out"])
        return t

    page, off = divmod(first, P)
    if fmt == peers.FP8_UE8M0:
        value_byte = (page, off * peers.UE8M0_VALUE_BYTES + 5)  # an e4m3 nope value
        rope_byte = (page, off * peers.UE8M0_VALUE_BYTES + peers.NOPE_DIM + 2 * 7 + 1)  # a bf16 high byte
        scale_byte = (page, peers.UE8M0_VALUE_BYTES * P + off * 8 + 2)
        # The scale padding byte of a written slot must never change.
        untouched = (page, peers.UE8M0_VALUE_BYTES * P + off * 8 + 7)
        out.append(("scale+2", with_cache(lambda c: c.__setitem__(scale_byte, (int(c[scale_byte]) + 2) % 256))))
        out.append(("rope byte", with_cache(lambda c: c.__setitem__(rope_byte, int(c[rope_byte]) ^ 0x40))))
    else:
        width = 2 * peers.HEAD_DIM if fmt == peers.BF16 else peers.HEAD_DIM
        value_byte = (page, off * width + 201)  # bf16: the high byte of value 100; e4m3: value 201
        mask = peers.kv_written_mask(tensors["cache_out"].shape, slots[slots >= 0], fmt, P)
        free = int((~mask).flatten().nonzero()[0])
        untouched = divmod(free, mask.shape[1])
    out.append(("untouched byte", with_cache(lambda c: c.__setitem__(untouched, int(c[untouched]) ^ 0x01))))
    out.append(("value byte", with_cache(lambda c: c.__setitem__(value_byte, int(c[value_byte]) ^ 0x40))))
    t = dict(tensors)
    t["q_out"] = tensors["q_out"].clone()
    row = int((slots >= 0).nonzero()[0])
    t["q_out"][row, 1, 9] ^= 0x40
    out.append(("q byte", t))
    return out


def _quantum_self_test(problems):
    """One e4m3 step apart passes and two fail, at a q_scale that is not a power of two (the
    quantum is taken at the stored value: 1.0 and 1.125 decode to 1.333 and 1.5 at 0.75)."""
    one = torch.full((1, 1, peers.HEAD_DIM), 0x38, dtype=torch.uint8)  # e4m3 1.0
    for byte, want_ok, what in ((0x39, True, "one step"), (0x3A, False, "two steps")):
        other = one.clone()
        other[..., 7] = byte
        stats = peers.compare_decoded(peers.decode_q(one, True, 0.75), peers.decode_q(other, True, 0.75))
        ok = stats["failed"] == 0
        print(f"  e4m3 bytes {what} apart at q_scale 0.75: {'pass' if ok else 'fail'}, as it must"
              if ok == want_ok else f"  e4m3 bytes {what} apart at q_scale 0.75: NOT AS IT MUST ({stats})")
        if ok != want_ok:
            problems.append(f"the tolerance at q_scale 0.75, {what}: failed {stats['failed']}")


def self_test(device):
    problems = []
    print("the tolerance:")
    _quantum_self_test(problems)
    with tempfile.TemporaryDirectory() as good, tempfile.TemporaryDirectory() as bad:
        seed = 7
        for fmt in peers.FORMATS:
            for q_format in ("fp8", "bf16"):
                seed += 1
                with torch.no_grad():
                    tensors, meta = _make_case(fmt, q_format, device, seed)
                name = f"{fmt}-{q_format}"
                save_safetensors(os.path.join(good, name + ".safetensors"), tensors, meta)
                for what, t in _corruptions(tensors, meta):
                    sub = os.path.join(bad, f"{name}-{what.replace(' ', '_')}")
                    os.makedirs(sub)
                    save_safetensors(os.path.join(sub, "case.safetensors"), t, meta)
        print("cases built by the peers themselves (must pass, every byte equal):")
        code, rows, errors = check_dir(good, device)
        if code != 0:
            problems.append(f"the good cases did not pass (exit {code})")
        for r in rows:
            if r["bytes_equal"] != 1.0:
                problems.append(f"{r['case']} {r['part']}: bytes_equal {r['bytes_equal']}, want 1")
        print("\ncases whose outputs come from a float64 RMSNorm (other roundings; must pass):")
        other = os.path.join(good, "other")
        os.makedirs(other)
        for fmt in peers.FORMATS:
            for q_format in ("fp8", "bf16"):
                seed += 1
                with torch.no_grad():
                    tensors, meta = _make_case(fmt, q_format, device, seed, T=512, H=16, other_rounding=True)
                save_safetensors(os.path.join(other, f"{fmt}-{q_format}.safetensors"), tensors, meta)
        code, rows, errors = check_dir(other, device)
        if code != 0:
            problems.append(f"the other-rounding cases did not pass (exit {code})")
        print("\ncorrupted copies (each must fail, on its values, scales or untouched bytes):")
        for sub in sorted(os.listdir(bad)):
            code, rows, errors = check_dir(os.path.join(bad, sub), device, quiet=True)
            why = sorted({k for r in rows if not r["ok"] for k, bad_ in (
                ("values", r["failed"] > 0), ("NaN", r["nan_mismatch"] > 0),
                ("scales", not r.get("scales_ok", True)),
                ("untouched", not (r.get("ours_untouched_ok", True) and r.get("peer_untouched_ok", True)))) if bad_})
            detected = code == 1 and not errors and why
            verdict = f"failed on {', '.join(why)}, as it must" if detected else \
                f"exit {code}, errors {errors}: NOT DETECTED"
            print(f"  {sub}: {verdict}")
            if not detected:
                problems.append(f"corruption {sub} not detected")
        # The reader against the safetensors package, where it is installed.
        try:
            from safetensors.torch import load_file, save_file
        except ImportError:
            print("\n(safetensors package not installed: reader cross-check skipped)")
        else:
            tensors, meta = _make_case(peers.FP8_UE8M0, "fp8", device, 99)
            path = os.path.join(good, "cross.safetensors")
            save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata={k: str(v) for k, v in meta.items()})
            mine, my_meta = load_safetensors(path)
            theirs = load_file(path)
            same = set(mine) == set(theirs) and all(
                mine[k].dtype == theirs[k].dtype and torch.equal(mine[k], theirs[k]) for k in mine)
            same = same and my_meta == {k: str(v) for k, v in meta.items()}
            print(f"\nreader vs the safetensors package: {'same tensors and metadata' if same else 'DIFFERENT'}")
            if not same:
                problems.append("load_safetensors disagrees with the safetensors package")
    if problems:
        print("\nSELF-TEST FAILED:\n  " + "\n  ".join(problems))
        return 1
    print("\nself-test ok")
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", nargs="?", help="folder of <case>.safetensors files written by cmd/bench --check-dir")
    p.add_argument("--device", default=None, help="device the peers run on (default: cuda if available, else cpu)")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--self-test", action="store_true", help="check the checker on cases it must pass and fail")
    p.add_argument("--no-layer", action="store_true", help="skip the whole-layer peer (peers.make_layer_fn)")
    p.add_argument("--compile", action="store_true",
                   help="also check the whole-layer peer under torch.compile(fullgraph=True, dynamic=False)")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.self_test:
        return self_test(device)
    if not args.dir:
        p.error("DIR is required (or --self-test)")
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a directory")
        return 2
    print(f"checking {args.dir} on {device} (torch {torch.__version__})")
    code, _, _ = check_dir(args.dir, device, args.json, layer=not args.no_layer, compiled=args.compile)
    return code


if __name__ == "__main__":
    sys.exit(main())
