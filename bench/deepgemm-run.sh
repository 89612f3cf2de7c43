#!/bin/bash
# DeepGEMM beside our FP8 GEMMs on the H200 (issue 25; issue 24's indexer score): the device
# script that .gpu-dg/run.sh is a copy of. Beside it (in the same folder):
#   dg-src.tgz   DeepGEMM's public source (commit in DG_COMMIT) with its submodules' include/
#                (cutlass) and include/ + src/ (fmt), as `git archive` gives them
#   cuda.test.gz attention/mla/cuda's test binary (CGO_ENABLED=0 go test -c -ldflags='-s -w')
#   deepgemm.py  bench/deepgemm.py
#   dg-art.tgz   optional: a previous call's built extension (and JIT cache)
# Within BUDGET seconds, every step under `timeout`: unpack; our TestGEMMTimes in the background
# (GPU) while DeepGEMM's extension builds (CPU), then probed; then DeepGEMM's kernels JIT-compiled
# in parallel processes and timed (bench/deepgemm.py bench). The extension variants, the first
# whose probe (one small fp8_gemm_nt, each step announced, Python's faulthandler on) passes is
# used: A = dg-art.tgz's build with NVCC JIT, A with NVRTC JIT, B = a fresh build with the
# system C++ compiler at setup.py's -O3 (started at once in the background) with NVCC, B with
# NVRTC. A probe that crashes gets a native backtrace from cuda-gdb. Log: $OUT/dg.log; results
# $OUT/deepgemm.json, $OUT/deepgemm.txt; the used build for the next call: $OUT/dg-art.tgz.
set -u
BUDGET=${BUDGET:-240}
T0=$(date +%s)
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd) # the repository root (run.sh lives in .gpu-dg/)
OUT=${OUT:-/tmp/dg-out}
mkdir -p "$OUT"
LOG=$OUT/dg.log
W=/tmp/dgw # fixed: the JIT cache's keys hold the include path
: >"$LOG"
left() { echo $((BUDGET - ($(date +%s) - T0))); }
say() { echo "[dg $(($(date +%s) - T0))s] $*" | tee -a "$LOG"; }
fail=0

say "start: $(date -u +%FT%TZ), budget ${BUDGET}s, DeepGEMM $(cat "$HERE/DG_COMMIT" 2>/dev/null)"
rm -rf "$W" && mkdir -p "$W/src"
if ! timeout 30 tar xzf "$HERE/dg-src.tgz" -C "$W/src" >>"$LOG" 2>&1; then say "FAIL: unpack dg-src.tgz"; exit 1; fi
ln -sfn ../../third-party/cutlass/include/cutlass "$W/src/deep_gemm/include/cutlass"
ln -sfn ../../third-party/cutlass/include/cute "$W/src/deep_gemm/include/cute"
cp -a "$W/src" "$W/srcB" # variant B's tree (its own _C.so)
timeout 20 gunzip -c "$HERE/cuda.test.gz" >"$W/cuda.test" && chmod +x "$W/cuda.test" || say "FAIL: unpack cuda.test.gz"
haveA=0
if [ -f "$HERE/dg-art.tgz" ] && timeout 20 tar xzf "$HERE/dg-art.tgz" -C "$W/src" >>"$LOG" 2>&1 && [ -f "$W/src/deep_gemm/_C.so" ]; then
  haveA=1
fi
mkdir -p "$W/jit-cache"
[ -d "$W/src/jit-cache/cache" ] && mv "$W/src/jit-cache/cache" "$W/jit-cache/"
say "unpacked (previous build: $haveA, $(ls "$W/jit-cache/cache" 2>/dev/null | wc -l) cached kernels)"

NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$NVCC" ]; then say "FAIL: no nvcc"; exit 1; fi
export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
export PATH=$CUDA_HOME/bin:$PYBIN:$PATH # nvcc for DeepGEMM's JIT, ninja for torch's extension build
export LD_LIBRARY_PATH=$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=$W/jit-cache DG_COMMIT=$(cat "$HERE/DG_COMMIT" 2>/dev/null || echo ?)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
SYSCXX=/usr/bin/g++
[ -x "$SYSCXX" ] || SYSCXX=${CXX:-c++}
GDB=$(command -v cuda-gdb || ls "$CUDA_HOME/bin/cuda-gdb" 2>/dev/null || true)

ours() { # our GEMMs and cuBLASLt at the same shapes, in the same call
  timeout "$1" env -C "$ROOT/attention/mla/cuda" "$W/cuda.test" -test.run 'TestGEMMTimes$' -test.v -gemm.times \
    -gemm.times.rows 1,8,32,128,512 -gemm.times.paths own,cublaslt,wgmma,wgmma-cluster >"$W/ours.log" 2>&1
  echo "ours rc=$? ($(grep -c '^TIMES' "$W/ours.log") TIMES lines)" >>"$W/ours.log"
}
ours 70 &
ours_pid=$!

# Variant B's build from the start (CPU only), so that it is ready if A fails.
(cd "$W/srcB" && CXX=$SYSCXX exec timeout 150 python3 "$HERE/deepgemm.py" build --src "$W/srcB" --opt=-O3) >"$W/buildB.log" 2>&1 &
buildB_pid=$!
tB=$(date +%s)

{
  echo "nvcc: $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*')), CUDA_HOME=$CUDA_HOME, cuda-gdb: ${GDB:-none}"
  echo "CXX=${CXX:-unset} CC=${CC:-unset}; c++ -> $(readlink -f "$(command -v c++)" 2>/dev/null); system: $("$SYSCXX" --version | head -1)"
  [ -x /opt/gcc/bin/g++ ] && echo "/opt/gcc/bin/g++: $(/opt/gcc/bin/g++ --version | head -1); $(ls /opt/gcc/lib64 2>/dev/null | grep -m 3 stdc++ | tr '\n' ' ')"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  timeout 20 python3 -c 'import torch, sys
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "cxx11abi", torch.compiled_with_cxx11_abi())
print("loaded:", sorted({l.split()[-1] for l in open("/proc/self/maps") if "stdc++" in l or "libgcc_s" in l}))'
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
  if [ $haveA -eq 1 ]; then echo "A: ldd _C.so:"; ldd "$W/src/deep_gemm/_C.so" | grep -E 'stdc|gcc_s|torch_python|not found'; fi
} >>"$LOG" 2>&1

probe() { # tree nvrtc name [preload]: one small call, the steps announced; 0 if it passes
  (cd /tmp && LD_PRELOAD=${4:-} DG_JIT_DEBUG=1 DG_JIT_USE_NVRTC=$2 timeout 60 python3 -X faulthandler "$HERE/deepgemm.py" probe --src "$1") >"$W/probe-$3.log" 2>&1
  local rc=$?
  say "probe $3: rc=$rc (139 = segfault, 124 = timeout), $(grep -c 'PROBE step' "$W/probe-$3.log") steps, last: $(grep 'PROBE' "$W/probe-$3.log" | tail -1)"
  if [ $rc -ne 0 ]; then
    { echo "--- probe $3, its log (the steps, Python's fault trace, errors, its end):"
      grep -E 'PROBE|Fatal|File "|Segmentation|rror|ssert|Running|Compiling|NVRTC|NVCC' "$W/probe-$3.log" | grep -v '^ *//' | head -40
      tail -n 15 "$W/probe-$3.log"; } 2>&1 | head -c 8000 >>"$LOG"
  fi
  return $rc
}
backtrace() { # tree nvrtc name: the crash's native stack (the extension's and libstdc++'s symbols only)
  [ -n "$GDB" ] || { echo "no cuda-gdb" >>"$W/gdb-$3.log"; return; }
  (cd /tmp && DG_JIT_USE_NVRTC=$2 timeout 60 "$GDB" -q -batch -ex 'set pagination off' -ex 'set confirm off' \
    -ex 'set auto-solib-add off' -ex run -ex 'sharedlibrary _C' -ex 'sharedlibrary libstdc' -ex 'sharedlibrary libc10' \
    -ex 'bt 40' -ex 'info sharedlibrary' --args python3 "$HERE/deepgemm.py" probe --src "$1") >"$W/gdb-$3.log" 2>&1
}

# The probes start a CUDA process each: after our timings, not during them (the build goes on).
wait $ours_pid
say "TestGEMMTimes: $(tail -n 1 "$W/ours.log")"
cat "$W/ours.log" >>"$LOG"

SRC="" NVRTC=0 VARIANT="" gdb_pid="" PRELOAD=""
# The C++ runtime of the compiler that built A (torch's extension build took $CXX), in case the
# process loads another one.
APRE=""
[ -x /opt/gcc/bin/g++ ] && APRE=$(/opt/gcc/bin/g++ -print-file-name=libstdc++.so.6 2>/dev/null)
[ -f "$APRE" ] || APRE=""
if [ $haveA -eq 1 ]; then
  if probe "$W/src" 0 A-nvcc; then SRC=$W/src NVRTC=0 VARIANT="previous build (dg-art.tgz), NVCC JIT"
  else
    backtrace "$W/src" 0 A & gdb_pid=$!
    if [ -n "$APRE" ] && probe "$W/src" 0 A-preload "$APRE"; then
      SRC=$W/src NVRTC=0 PRELOAD=$APRE VARIANT="previous build (dg-art.tgz) with LD_PRELOAD=$APRE, NVCC JIT"
    elif probe "$W/src" 1 A-nvrtc; then SRC=$W/src NVRTC=1 VARIANT="previous build (dg-art.tgz), NVRTC JIT"; fi
  fi
fi
if [ -z "$SRC" ]; then
  say "waiting for build B (system C++ compiler $SYSCXX, -O3)"
  wait $buildB_pid
  rc=$?
  say "build B: rc=$rc in $(($(date +%s) - tB))s"
  tail -n 4 "$W/buildB.log" >>"$LOG"
  if [ $rc -eq 0 ] && [ -f "$W/srcB/deep_gemm/_C.so" ]; then
    ldd "$W/srcB/deep_gemm/_C.so" | grep -E 'stdc|gcc_s|not found' >>"$LOG"
    if probe "$W/srcB" 0 B-nvcc; then SRC=$W/srcB NVRTC=0 VARIANT="fresh build, system C++ compiler, -O3, NVCC JIT"
    else
      [ -z "$gdb_pid" ] && { backtrace "$W/srcB" 0 B & gdb_pid=$!; }
      if probe "$W/srcB" 1 B-nvrtc; then SRC=$W/srcB NVRTC=1 VARIANT="fresh build, system C++ compiler, -O3, NVRTC JIT"; fi
    fi
  else
    say "FAIL: build B rc=$rc (124 = timeout); its log's errors and end:"
    { grep -n -i -m 20 'error' "$W/buildB.log"; tail -n 30 "$W/buildB.log"; } >>"$LOG"
  fi
else
  kill "$buildB_pid" 2>/dev/null # not needed: give its core to the JIT
fi
if [ -n "$SRC" ]; then
  say "using: $VARIANT"
  export DG_JIT_USE_NVRTC=$NVRTC DG_BUILD_S="$VARIANT"
  P=14
  pt=$(( $(left) - 70 )); [ $pt -gt 100 ] && pt=100
  if [ $pt -ge 15 ]; then
    say "JIT prewarm: $P processes, ${pt}s"
    t=$(date +%s)
    pids=()
    for i in $(seq 0 $((P - 1))); do
      (cd /tmp && LD_PRELOAD=$PRELOAD exec timeout "$pt" python3 -X faulthandler "$HERE/deepgemm.py" prewarm --src "$SRC" --part $i --parts $P) >"$W/prewarm-$i.log" 2>&1 &
      pids+=($!)
    done
    wait "${pids[@]}"
    DG_PREWARM_S=$(($(date +%s) - t))
    grep -h -E '^PREWARM' "$W"/prewarm-*.log >>"$LOG"
    first=$(grep -L -E '^PREWARM.* s$' "$W"/prewarm-*.log | head -1)
    [ -n "$first" ] && { echo "--- a prewarm log with no finished item, $first:"; grep -v '^ *//' "$first" | head -c 5000; } >>"$LOG"
    say "prewarm ${DG_PREWARM_S}s: $(cat "$W"/prewarm-*.log | grep -c '^PREWARM.* s$') ok, $(cat "$W"/prewarm-*.log | grep -c '^PREWARM.*FAILED') failed, $(ls "$W/jit-cache/cache" 2>/dev/null | wc -l) kernels cached"
  else
    DG_PREWARM_S="skipped"
    say "prewarm skipped: ${pt}s left for it"
  fi
  export DG_PREWARM_S
  bt=$(( $(left) - 12 ))
  if [ $bt -ge 15 ]; then
    say "bench: ${bt}s"
    (cd /tmp && LD_PRELOAD=$PRELOAD DG_PRINT_CONFIGS=1 exec timeout "$bt" python3 -X faulthandler "$HERE/deepgemm.py" bench --src "$SRC" --out "$OUT" --budget $((bt - 8))) >>"$LOG" 2>&1
    rc=$?
    [ $rc -ne 0 ] && { say "bench rc=$rc (1 = a check failed, 124 = timeout, 139 = segfault)"; fail=1; }
  else
    say "bench skipped: ${bt}s left"; fail=1
  fi
  # The build used and the compiled kernels, for the next call (carry it as .gpu-dg/dg-art.tgz).
  mkdir -p "$SRC/jit-cache" && rm -rf "$SRC/jit-cache/cache" && cp -r "$W/jit-cache/cache" "$SRC/jit-cache/" 2>/dev/null
  timeout 15 tar czf "$OUT/dg-art.tgz" -C "$SRC" deep_gemm/_C.so jit-cache 2>>"$LOG" && say "dg-art.tgz: $(du -h "$OUT/dg-art.tgz" | cut -f1)"
else
  say "FAIL: no extension variant passed its probe"
  fail=1
fi
if [ -n "$gdb_pid" ]; then
  wait "$gdb_pid" 2>/dev/null
  { echo "--- cuda-gdb backtrace of the crashing probe:"; grep -E '^#|signal|SIG|Program|^0x|From|\.so' "$W"/gdb-*.log | head -90; } >>"$LOG"
  say "cuda-gdb: $(grep -h -m 1 'signal' "$W"/gdb-*.log)"
fi

summary=$(grep -E '^(device|DG |bench:)|TestGEMMTimes|probe |using:|FAIL' "$LOG" | head -70)
say "summary:"
echo "$summary" | tee -a "$LOG"
say "done in $(($(date +%s) - T0))s, fail=$fail"
exit $fail
