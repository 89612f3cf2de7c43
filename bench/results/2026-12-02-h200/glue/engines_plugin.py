"""Plugin for bench/engines.py (not committed): builds SGLang's and vLLM's DSv4 prologue kernels from
the public sources copied under src/ and exposes them as engines.

  python3 engines_plugin.py --build     # compile both into build/ (run ahead, in the background)

Sources (copied by git archive from fetched snapshots):
  src/sglang: flytiger-eco/sglang-for-sail 0bda0b168ad5 (a mirror of sgl-project/sglang, 2026-08-20):
      python/sglang/kernels/jit/include/, python/sglang/kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh
  src/tvmffi: apache/tvm-ffi v0.1.11 include/ (the version SGLang pins); src/dlpack: dmlc/dlpack include/
  src/vllm: BlivionIaG/vllm e94243893 (a mirror of vllm-project/vllm, 2026-07-18):
      csrc/libtorch_stable/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu and the headers it includes,
      vllm/models/deepseek_v4/common/ops/fused_qk_rmsnorm.py
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
BUILD = os.path.join(HERE, "build")
SGL_SO = os.path.join(BUILD, "sgl_dsv4.so")
VLLM_SO = os.path.join(BUILD, "vllm_dsv4.so")
LOGS = {"sglang": os.path.join(BUILD, "sglang.log"), "vllm": os.path.join(BUILD, "vllm.log"),
        "load": os.path.join(BUILD, "load.log")}
ARCH = ["-gencode=arch=compute_90a,code=sm_90a"]
BUILD_TIMEOUT_S = float(os.environ.get("ENGINES_BUILD_TIMEOUT_S", "140"))

SGL_SOURCE = ("sgl-project/sglang (mirror flytiger-eco/sglang-for-sail 0bda0b168ad5, 2026-08-20): "
              "python/sglang/kernels/jit/csrc/deepseek_v4/main_norm_rope.cuh, fused_q_norm_rope<bf16,512,64,int32,PDL> "
              "and fused_k_norm_rope_flashmla<bf16,512,64,int32,page 64,PDL>, nvcc -std=c++20 -O3 "
              "--expt-relaxed-constexpr -DSGL_CUDA_ARCH=900 sm_90a (load_jit's flags), tvm-ffi 0.1.11 headers "
              "(DLPack 1.1 headers plus the one 1.2 typedef tvm-ffi names, DLPackManagedTensorAllocator)")
VLLM_SOURCE = ("vllm-project/vllm (mirror BlivionIaG/vllm e94243893, 2026-07-18): "
               "csrc/libtorch_stable/fused_deepseek_v4_qnorm_rope_kv_insert_kernel.cu through its "
               "launchFusedDeepseekV4QNormRopeKVRopeQuantInsert<bf16> (PDL), nvcc -std=c++20 -O3 "
               "--expt-relaxed-constexpr -DENABLE_FP8 -DUSE_CUDA -DTORCH_TARGET_VERSION=0x020B000000000000ULL "
               "sm_90a (vLLM's CMake definitions for _C_stable_libtorch); the KV RMSNorm is its Triton "
               "_fused_q_kv_rmsnorm_kernel (vllm/models/deepseek_v4/common/ops/fused_qk_rmsnorm.py) on the KV rows only")

_which = None  # the engine this process builds: its log


def _log(msg):
    os.makedirs(BUILD, exist_ok=True)
    with open(LOGS[_which or "load"], "a") as f:
        f.write(msg.rstrip() + "\n")
    print(msg, flush=True)


def _run(cmd, what, deadline):
    """Runs cmd, logging its command line, its output (the compiler's errors) and its exit status;
    killed at the deadline (time.time()), which is then exit 124."""
    t0 = time.time()
    _log(f"$ {' '.join(cmd)}")
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(1.0, deadline - t0))
        rc, out = p.returncode, (p.stdout + p.stderr).strip()
    except subprocess.TimeoutExpired as e:
        rc = 124
        out = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")) + \
              ((e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or ""))
        out = (out.strip() + f"\n(killed: past the build deadline of {BUILD_TIMEOUT_S:.0f} s)").strip()
    except OSError as e:
        rc, out = 127, f"{type(e).__name__}: {e}"
    if out:
        _log(out[-20000:])
    _log(f"{what}: exit {rc} in {time.time() - t0:.1f} s")
    return rc


def _undefined(so):
    try:
        p = subprocess.run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:  # no nm: the load in engines() will tell
        _log(f"nm: {type(e).__name__}: {e}")
        return []
    return [l.split()[-1] for l in p.stdout.splitlines() if l.strip()]


def _publish(tmp, final):
    """Moves a finished build into place: engines() loads only what a build finished."""
    os.replace(tmp, final)
    _log(f"built {final} ({os.path.getsize(final)} bytes)")


def build_sglang(deadline):
    inc = os.path.join(SRC, "sglang/python/sglang/kernels/jit")
    tmp = os.path.join(BUILD, "partial-" + os.path.basename(SGL_SO))
    base = ["nvcc", "-std=c++20", "-O3", "--expt-relaxed-constexpr", "-DSGL_CUDA_ARCH=900", *ARCH,
            "-Xcompiler", "-fPIC", "-shared",
            "-I", os.path.join(inc, "include"), "-I", inc,
            "-I", os.path.join(SRC, "tvmffi/include"), "-I", os.path.join(SRC, "dlpack/include"),
            "-include", os.path.join(HERE, "dlpack_compat.h")]
    rc = _run(base + [os.path.join(HERE, "sgl_glue.cu"), "-o", tmp], "sglang build", deadline)
    if rc != 0:
        return rc
    # tvm-ffi's C API (libtvm_ffi) is not built here and the glue calls none of it (a host-side
    # compile of the glue references no TVMFFI symbol). Should an inline header function still
    # reference one, stub it (aborts if ever called) and link again, so the library loads.
    missing = [s for s in _undefined(tmp) if s.startswith(("TVMFFI", "_ZN3tvm"))]
    if missing:
        _log(f"sglang: {len(missing)} tvm-ffi symbols undefined, stubbed: {' '.join(missing[:20])}")
        stub = os.path.join(BUILD, "tvm_stub.cu")
        with open(stub, "w") as f:
            f.write("#include <cstdlib>\n")
            for s in missing:
                f.write(f'extern "C" void {s}(void) {{ std::abort(); }}\n')
        rc = _run(base + [os.path.join(HERE, "sgl_glue.cu"), stub, "-o", tmp], "sglang relink with stubs", deadline)
        if rc != 0:
            return rc
    _publish(tmp, SGL_SO)
    return 0


def build_vllm(deadline):
    import torch
    tdir = os.path.dirname(torch.__file__)
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    lib = os.path.join(tdir, "lib")
    tmp = os.path.join(BUILD, "partial-" + os.path.basename(VLLM_SO))
    # vLLM's CMake for _C_stable_libtorch: C++20, torch's COMMON_NVCC_FLAGS less the __CUDA_NO_HALF*
    # macros (CUDA >= 12), ENABLE_FP8, TORCH_TARGET_VERSION 2.11, USE_CUDA (torch's CUDA shims).
    cmd = ["nvcc", "-std=c++20", "-O3", "--expt-relaxed-constexpr", "-DENABLE_FP8", *ARCH,
           "-DTORCH_TARGET_VERSION=0x020B000000000000ULL", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-DUSE_CUDA",
           "-Xcompiler", "-fPIC", "-shared",
           "-I", os.path.join(tdir, "include"), "-I", os.path.join(tdir, "include/torch/csrc/api/include"),
           "-I", os.path.join(SRC, "vllm/csrc/libtorch_stable"), "-I", os.path.join(SRC, "vllm/csrc"),
           os.path.join(HERE, "vllm_glue.cu"), "-o", tmp,
           "-L", lib, "-ltorch", "-ltorch_cpu", "-ltorch_cuda", "-lc10", "-lc10_cuda",
           "-Xlinker", "-rpath", "-Xlinker", lib]
    rc = _run(cmd, "vllm build", deadline)
    if rc != 0:
        return rc
    _publish(tmp, VLLM_SO)
    return 0


BUILDERS = {"sglang": build_sglang, "vllm": build_vllm}


def build_log():
    out = []
    for name, path in LOGS.items():
        try:
            with open(path) as f:
                out.append(f"==== {name}\n" + f.read()[-15000:])
        except OSError:
            out.append(f"==== {name}\n(no build log)")
    return "\n".join(out)


def _stream():
    import torch
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


class SGLang:
    name = "SGLang fused_q_norm_rope + fused_k_norm_rope_flashmla"
    source = SGL_SOURCE
    q_format = "bf16"
    kv_format = "fp8_ue8m0"
    kv_norm = True
    kv_weight_bf16 = True
    note = ("two launches a layer: the KV kernel (block per token: RMSNorm with the weight, RoPE, UE8M0 "
            "FP8, FlashMLA page store) then the Q kernel (warp per (token, head): RMSNorm, RoPE, bf16 Q out)")

    def __init__(self):
        self.lib = ctypes.CDLL(SGL_SO, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        self.lib.sgl_q_norm_rope.restype = ctypes.c_int
        self.lib.sgl_q_norm_rope.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [
            ctypes.c_uint32, ctypes.c_uint32, ctypes.c_float, ctypes.c_void_p]
        self.lib.sgl_k_norm_rope_flashmla.restype = ctypes.c_int
        self.lib.sgl_k_norm_rope_flashmla.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64, ctypes.c_uint32,
                                                                              ctypes.c_float, ctypes.c_void_p]

    def prepare(self, layer):
        import torch
        assert layer["page_size"] == 64, "built for page size 64"
        T, H, qlr = layer["q"].shape[0], layer["heads"], layer["q_lora_rank"]
        kv = layer["fused"][:, qlr:]
        w = layer["w"].to(torch.bfloat16).contiguous()
        freqs = layer["cos_sin"].reshape(layer["cos_sin"].shape[0], 64).contiguous()  # (cos, sin) interleaved
        pos = layer["positions"].to(torch.int32).contiguous()
        loc = layer["slots"].to(torch.int32).contiguous()
        q_in = layer["q"]
        q_out = torch.empty_like(q_in)
        cache = layer["cache"]
        eps = float(layer["eps"])
        lib = self.lib

        def kv_fn():
            rc = lib.sgl_k_norm_rope_flashmla(_ptr(kv), _ptr(w), _ptr(freqs), _ptr(pos), _ptr(loc), _ptr(cache),
                                              kv.stride(0), T, eps, _stream())
            if rc:
                raise RuntimeError(f"sgl_k_norm_rope_flashmla: {rc}")

        def q_fn():
            rc = lib.sgl_q_norm_rope(_ptr(q_in), _ptr(q_out), _ptr(freqs), _ptr(pos), q_in.stride(0),
                                     q_out.stride(0), T, H, eps, _stream())
            if rc:
                raise RuntimeError(f"sgl_q_norm_rope: {rc}")

        def layer_fn():
            kv_fn()
            q_fn()

        return {"layer": layer_fn, "kernels": {"kv": kv_fn, "q": q_fn}, "q_out": q_out,
                "keep": (kv, w, freqs, pos, loc, q_in, q_out, cache)}


def _vllm_rmsnorm_kernel():
    """vLLM's Triton RMSNorm (fused_qk_rmsnorm.py) with its one vLLM import provided."""
    import triton
    import triton.language as tl
    pkg = types.ModuleType("vllm")
    tu = types.ModuleType("vllm.triton_utils")
    tu.tl, tu.triton = tl, triton
    pkg.triton_utils = tu
    sys.modules.setdefault("vllm", pkg)
    sys.modules.setdefault("vllm.triton_utils", tu)
    path = os.path.join(SRC, "vllm/vllm/models/deepseek_v4/common/ops/fused_qk_rmsnorm.py")
    spec = importlib.util.spec_from_file_location("vllm_fused_qk_rmsnorm", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._fused_q_kv_rmsnorm_kernel


class VLLM:
    name = "vLLM fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert + its KV RMSNorm"
    source = VLLM_SOURCE
    q_format = "bf16"
    kv_format = "fp8_ue8m0"
    kv_norm = True
    note = ("two launches a layer: vLLM's Triton RMSNorm on the KV rows (strided latent in, contiguous bf16 "
            "out; in vLLM it runs with the q_lora norm, before wq_b), then its fused CUDA kernel (warp per "
            "(token, head slot): Q RMSNorm + RoPE, bf16 Q out padded to the head bucket; KV RoPE + UE8M0 FP8 "
            "+ page insert)")

    def __init__(self):
        self.lib = ctypes.CDLL(VLLM_SO, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        f = self.lib.vllm_dsv4_qnorm_rope_kv_insert
        f.restype = ctypes.c_int
        f.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_float] + [ctypes.c_int] * 6 + [ctypes.c_void_p]
        self.norm = _vllm_rmsnorm_kernel()

    def prepare(self, layer):
        import torch
        T, H, qlr = layer["q"].shape[0], layer["heads"], layer["q_lora_rank"]
        hp = next(n for n in (8, 16, 32, 64, 128) if n >= H)
        kv_in = layer["fused"][:, qlr:]
        kv = torch.empty((T, 512), dtype=torch.bfloat16, device=kv_in.device)
        w = layer["w"].contiguous()
        cs = layer["cos_sin"]
        cos_sin = torch.cat((cs[..., 0], cs[..., 1]), dim=-1).contiguous()  # cos || sin
        pos = layer["positions"].to(torch.int64).contiguous()
        slots = layer["slots"].to(torch.int64).contiguous()
        q_in = layer["q"]
        q_pad = torch.empty((T, hp, 512), dtype=torch.bfloat16, device=q_in.device)
        cache = layer["cache"]
        eps = float(layer["eps"])
        f, norm = self.lib.vllm_dsv4_qnorm_rope_kv_insert, self.norm

        def norm_fn():
            # Task 0 of the kernel is the q_lora branch; its KV branch is the same code, so the KV rows
            # go through task 0 alone (no q_lora rows: that norm is not part of this prologue).
            norm[(T, 1)](kv_in, kv, w, kv_in.stride(0), kv.stride(0), kv_in, kv, w, kv_in.stride(0), kv.stride(0),
                         eps, Q_SIZE=512, KV_SIZE=512, BLOCK_SIZE=512)

        def fused_fn():
            rc = f(_ptr(q_in), _ptr(q_pad), _ptr(kv), _ptr(cache), _ptr(slots), _ptr(pos), _ptr(cos_sin), eps,
                   T, T, H, hp, layer["page_size"], cache.stride(0), _stream())
            if rc:
                raise RuntimeError(f"vllm_dsv4_qnorm_rope_kv_insert: {rc}")

        def layer_fn():
            norm_fn()
            fused_fn()

        return {"layer": layer_fn, "kernels": {"kv_norm": norm_fn, "fused": fused_fn}, "q_out": q_pad[:, :H],
                "keep": (kv_in, kv, w, cos_sin, pos, slots, q_in, q_pad, cache)}


def engines(device):
    """The engines whose build finished and whose library loads; ENGINES_ONLY=sglang or vllm (or
    both, comma-separated) picks which, so that run.sh times each in its own process (a fault in
    one engine's kernel then cannot take the other's CUDA context with it)."""
    only = [x for x in os.environ.get("ENGINES_ONLY", "sglang,vllm").split(",") if x]
    out = []
    for key, cls, so in (("sglang", SGLang, SGL_SO), ("vllm", VLLM, VLLM_SO)):
        if key not in only:
            continue
        if not os.path.exists(so) and not os.path.exists(LOGS[key]):
            # never built (bench/engines.py run without run.sh's builds first): build it now
            global _which
            _which = key
            try:
                BUILDERS[key](time.time() + BUILD_TIMEOUT_S)
            except Exception as e:
                _log(f"{key} build raised: {type(e).__name__}: {e}")
            finally:
                _which = None
        if not os.path.exists(so):
            _log(f"{cls.name}: {so} missing (the build failed or did not finish; see its build log)")
            continue
        try:
            out.append(cls())
            _log(f"{cls.name}: loaded {so}")
        except Exception as e:
            _log(f"{cls.name}: loading failed: {type(e).__name__}: {e}")
    return out


if __name__ == "__main__":
    # python3 engines_plugin.py --build NAME: builds one engine (sglang or vllm) into build/, its
    # log in build/NAME.log; run one process per engine, so one's failure cannot stop the other.
    if len(sys.argv) == 3 and sys.argv[1] == "--build" and sys.argv[2] in BUILDERS:
        _which = sys.argv[2]
        os.makedirs(BUILD, exist_ok=True)
        t0 = time.time()
        try:
            rc = BUILDERS[_which](t0 + BUILD_TIMEOUT_S)
        except Exception:
            import traceback
            _log(f"{_which} build raised:\n{traceback.format_exc()}")
            rc = 1
        _log(f"{_which}: build {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.time() - t0:.1f} s")
        sys.exit(rc)
    sys.exit("usage: engines_plugin.py --build sglang|vllm")
