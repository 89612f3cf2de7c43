#!/bin/bash
# DeepGEMM beside our FP8 GEMMs on the H200 (issue 25; issue 24's indexer score): the device
# script that .gpu-dg/run.sh is a copy of. Run from the repository root on the device, with
# beside it (in the same folder):
#   dg-src.tgz   DeepGEMM's public source (commit in DG_COMMIT) with its submodules' include/
#                (cutlass) and include/ + src/ (fmt), as `git archive` gives them
#   cuda.test.gz attention/mla/cuda's test binary (CGO_ENABLED=0 go test -c -ldflags='-s -w')
#   deepgemm.py  bench/deepgemm.py
#   dg-art.tgz   optional: a previous call's built extension and JIT cache (skips the build)
# Steps, each under `timeout`, all within BUDGET seconds: unpack; build DeepGEMM's torch
# extension while our TestGEMMTimes runs (CPU against GPU); JIT-compile DeepGEMM's kernels in
# parallel processes; time and check them (bench/deepgemm.py bench). Log: $OUT/dg.log; results
# $OUT/deepgemm.json, $OUT/deepgemm.txt; the build for the next call: $OUT/dg-art.tgz.
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
t=$(date +%s)
if ! timeout 30 tar xzf "$HERE/dg-src.tgz" -C "$W/src" >>"$LOG" 2>&1; then say "FAIL: unpack dg-src.tgz"; exit 1; fi
ln -sfn ../../third-party/cutlass/include/cutlass "$W/src/deep_gemm/include/cutlass"
ln -sfn ../../third-party/cutlass/include/cute "$W/src/deep_gemm/include/cute"
timeout 20 gunzip -c "$HERE/cuda.test.gz" >"$W/cuda.test" && chmod +x "$W/cuda.test" || say "FAIL: unpack cuda.test.gz"
say "unpacked in $(($(date +%s) - t))s"

NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$NVCC" ]; then say "FAIL: no nvcc"; exit 1; fi
export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$NVCC")")")
PYBIN=$(dirname "$(python3 -c 'import sys; print(sys.executable)')")
export PATH=$CUDA_HOME/bin:$PYBIN:$PATH # nvcc for DeepGEMM's JIT, ninja for torch's extension build
export LD_LIBRARY_PATH=$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}
export DG_JIT_CACHE_DIR=$W/jit-cache DG_COMMIT=$(cat "$HERE/DG_COMMIT" 2>/dev/null || echo ?)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
{
  echo "nvcc: $NVCC ($("$NVCC" --version | grep -o 'release [0-9.]*'))  CUDA_HOME=$CUDA_HOME: $(ls "$CUDA_HOME" | tr '\n' ' ')"
  ls "$CUDA_HOME"/lib64/libnvrtc.so* "$CUDA_HOME"/lib64/libcudart.so* 2>&1 | head -4
  timeout 20 python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())'
  g++ --version | head -1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
} >>"$LOG" 2>&1

ours() { # our GEMMs and cuBLASLt at the same shapes, in the same call
  timeout "$1" env -C "$ROOT/attention/mla/cuda" "$W/cuda.test" -test.run 'TestGEMMTimes$' -test.v -gemm.times \
    -gemm.times.rows 1,8,32,128,512 -gemm.times.paths own,cublaslt,wgmma,wgmma-cluster >"$W/ours.log" 2>&1
  echo "ours rc=$? ($(grep -c '^TIMES' "$W/ours.log") TIMES lines)" >>"$W/ours.log"
}

built=0
if [ -f "$HERE/dg-art.tgz" ] && timeout 20 tar xzf "$HERE/dg-art.tgz" -C "$W/src" >>"$LOG" 2>&1 && [ -f "$W/src/deep_gemm/_C.so" ]; then
  mkdir -p "$W/jit-cache" && { [ -d "$W/src/jit-cache/cache" ] && mv "$W/src/jit-cache/cache" "$W/jit-cache/"; }
  say "reusing the previous call's extension and $(ls "$W/jit-cache/cache" 2>/dev/null | wc -l) cached kernels (dg-art.tgz)"
  DG_BUILD_S="reused"
  ours 70
  built=1
else
  say "building DeepGEMM's extension (csrc/python_api.cpp) while TestGEMMTimes runs"
  ours 70 &
  ours_pid=$!
  t=$(date +%s)
  (cd "$W/src" && timeout 160 python3 "$HERE/deepgemm.py" build --src "$W/src" --opt -O1) >"$W/build.log" 2>&1
  rc=$?
  DG_BUILD_S=$(($(date +%s) - t))
  if [ $rc -eq 0 ] && [ -f "$W/src/deep_gemm/_C.so" ]; then
    built=1
    say "extension built in ${DG_BUILD_S}s"
    tail -n 3 "$W/build.log" >>"$LOG"
  else
    say "FAIL: extension build rc=$rc after ${DG_BUILD_S}s (124 = timeout); the build log's end:"
    grep -n -i -m 20 'error' "$W/build.log" >>"$LOG"
    tail -n 40 "$W/build.log" >>"$LOG"
    fail=1
  fi
  wait $ours_pid
fi
export DG_BUILD_S
say "TestGEMMTimes: $(tail -n 1 "$W/ours.log")"
cat "$W/ours.log" >>"$LOG"

if [ $built -eq 1 ]; then
  t=$(date +%s)
  if ! (cd /tmp && timeout 60 python3 -c "import sys; sys.path.insert(0, '$W/src'); import deep_gemm; print('deep_gemm', deep_gemm.__version__, 'imported, fp8_gemm_nt:', hasattr(deep_gemm, 'fp8_gemm_nt'))") >>"$LOG" 2>&1; then
    say "FAIL: import deep_gemm"; fail=1; built=0
  fi
  say "import check $(($(date +%s) - t))s"
fi

if [ $built -eq 1 ]; then
  P=14
  pt=$(( $(left) - 75 )); [ $pt -gt 120 ] && pt=120
  if [ $pt -ge 15 ]; then
    say "JIT prewarm: $P processes, ${pt}s"
    t=$(date +%s)
    for i in $(seq 0 $((P - 1))); do
      (cd /tmp && timeout "$pt" python3 "$HERE/deepgemm.py" prewarm --src "$W/src" --part $i --parts $P) >"$W/prewarm-$i.log" 2>&1 &
    done
    wait
    DG_PREWARM_S=$(($(date +%s) - t))
    cat "$W"/prewarm-*.log | grep -v '^$' | grep -E 'PREWARM|rror|assert' | head -80 >>"$LOG"
    first=$(grep -l FAILED "$W"/prewarm-*.log | head -1)
    [ -n "$first" ] && { echo "--- the first failing prewarm log, $first:"; head -c 6000 "$first"; } >>"$LOG"
    say "prewarm ${DG_PREWARM_S}s: $(cat "$W"/prewarm-*.log | grep -c 'PREWARM.* s$') ok, $(cat "$W"/prewarm-*.log | grep -c FAILED) failed, $(ls "$W/jit-cache/cache" 2>/dev/null | wc -l) kernels cached"
  else
    DG_PREWARM_S="skipped"
    say "prewarm skipped: ${pt}s left for it"
  fi
  export DG_PREWARM_S
  bt=$(( $(left) - 12 ))
  if [ $bt -ge 15 ]; then
    say "bench: ${bt}s"
    (cd /tmp && DG_PRINT_CONFIGS=1 timeout "$bt" python3 "$HERE/deepgemm.py" bench --src "$W/src" --out "$OUT" --budget $((bt - 8))) >>"$LOG" 2>&1
    rc=$?
    [ $rc -ne 0 ] && { say "bench rc=$rc (1 = a check failed, 124 = timeout)"; fail=1; }
  else
    say "bench skipped: ${bt}s left"; fail=1
  fi
  # The build and the compiled kernels, for the next call (carry it back as .gpu-dg/dg-art.tgz).
  mkdir -p "$W/src/jit-cache" && rm -rf "$W/src/jit-cache/cache" && cp -r "$W/jit-cache/cache" "$W/src/jit-cache/" 2>/dev/null
  timeout 15 tar czf "$OUT/dg-art.tgz" -C "$W/src" deep_gemm/_C.so jit-cache 2>>"$LOG" && say "dg-art.tgz: $(du -h "$OUT/dg-art.tgz" | cut -f1)"
fi

summary=$(grep -E '^(device|DG |bench:)|TestGEMMTimes|FAIL' "$LOG" | head -70)
say "summary:"
echo "$summary" | tee -a "$LOG"
say "done in $(($(date +%s) - T0))s, fail=$fail"
exit $fail
