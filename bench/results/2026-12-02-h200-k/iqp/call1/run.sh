#!/bin/bash
# iqp round 1 (issue 23, the indexer's prefill cost in the ratio-4 layer): measurements, and a new query kernel (indexer_query_tok, not the default) checked and timed.
# Binaries of branch iqp (main + cmd/bench ablation modes, cuBLASLt heuristic knobs, query grid knobs, indexer_query_tok).
# Steps (each with a timeout; the whole within 145 s):
#  layer    cmd/bench --indexer-only at V4-Flash and V4-Pro 4K/16K prefill: (a), (b) and the new ablations
#           (b-q) no query step, (b-g) no indexer wq_b GEMM, (b-p) projection GEMM without the indexer's 576
#           columns, (b-qg) neither GEMM nor query: b minus each = what the piece costs the layer.
#  gemm     TestGEMMTimes at 4096/16384 rows: indexer wq_b (flash, pro) and flash wq_b on cuBLASLt (its heuristic's 1st..4th result), cuBLASLt
#           without split-K, the wgmma kernel, wgmma wide-pipe (cold = L2 flushed; b2b).
#  query    BenchmarkCUDAIndexer query at 4K/16K: stream (default grid, up to 16 blocks/SM), stream-gN (N blocks/SM), lane,
#           tok (indexer_query_tok: contiguous units a warp, one wave of 2 blocks/SM), tok-gN.
#  conf-tok TestCUDAIndexerKernels/query=tok* (the new kernel indexer_query_tok, byte for byte).
#  layer-tok cmd/bench, V4-Flash 4K/16K, iquery=7 (indexer_query_tok in the layer).
#  ncu      Nsight Compute of indexer_query_stream and indexer_query_tok at 4K rows.
#  nsys     (if nsys exists) per-kernel trace of the V4-Flash 4K layer graphs.
#  bf16     TestBF16GEMMTimes at 4096/16384 rows, cuBLASLt (heuristic 1st..3rd) and wgmma: r4-fused (2624) against r4 (2048).
#  gemms2   BenchmarkCUDAIndexerGEMMs at 4096: two FP8 GEMMs vs fused [wq_b; idx wq_b]; 3 bf16 GEMMs vs one.
#  layer-s1 cmd/bench, V4-Flash 4K/16K, istream=1 (query path on the main stream as the engine's default);
#  layer-gN the same with iqbpsm=N (the query kernel's grid at most N blocks a multiprocessor, default 16).
# Log: $OUT/iqp.log; each step's output $OUT/<step>.txt (+ layer-*.json, nsys csv gz).
set -u
OUT=${OUT:-/tmp/iqp-out}
mkdir -p "$OUT"
LOG=$OUT/iqp.log
D=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$D/.." && pwd)
B=/tmp/iqp
T0=$(date +%s)
END=$((T0 + 145))
fail=0
: > "$LOG"
echo "# iqp round 1: binaries of $(cat "$D/COMMIT" 2>/dev/null), $(date -u +%FT%TZ)" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
mkdir -p $B && for f in cuda.test bench; do gunzip -c "$D/$f.gz" > $B/$f && chmod +x $B/$f || { echo "gunzip $f failed"; exit 1; }; done
step() { # name timeout dir cmd...
  local name=$1 to=$2 dir=$3; shift 3
  local left=$((END - $(date +%s)))
  if [ "$left" -lt 5 ]; then echo "=== $name skipped (no time left)" | tee -a "$LOG"; return 1; fi
  [ "$to" -gt "$left" ] && to=$left
  local s=$(date +%s)
  echo "=== $name: $*" >> "$LOG"
  (cd "$dir" && timeout "$to" "$@") > "$OUT/$name.txt" 2>&1
  local rc=$?
  cat "$OUT/$name.txt" >> "$LOG"
  echo "=== $name rc=$rc ($(( $(date +%s) - s )) s of $to)" | tee -a "$LOG"
  return $rc
}
PKG=$R/attention/mla/cuda
modes() { grep -E '^  indexer (flash|pro) context' "$OUT/$1.txt" | sed -E 's/^  indexer //; s/ context=0//; s/ \[[0-9.]+ s\]$//'; }
# 1. the layer with the ablations (first kernel-touching step: cold NVRTC compile).
step layer 75 "$R" $B/bench --indexer-only --indexer-no-topk --models flash,pro --graph-reps 10 --indexer-batches none --indexer-ctx-tokens 4096,16384 --out "$OUT/layer.json" || fail=1
modes layer
# 2. FP8 GEMM paths at prefill sizes.
step gemm 24 "$PKG" $B/cuda.test -test.run 'TestGEMMTimes$' -gemm.times -gemm.times.rows 4096,16384 -gemm.times.shapes 'idx-wqb|^flash-wqb$' -gemm.times.paths cublaslt,cublaslt-h2,cublaslt-h3,cublaslt-h4,cublaslt-nosplit,wgmma,wgmma-wpipe -test.v || fail=1
grep -E '^(TIMES|ALGO)' "$OUT/gemm.txt" | sed -E 's/ +/ /g'
# 3. the query kernel at prefill, grids.
step query 20 "$PKG" $B/cuda.test -test.run '^$' -test.bench '^BenchmarkCUDAIndexer$/query/(prefill-4K|prefill-16K)/(stream|stream-g[0-9]+|lane|tok|tok-g[0-9]+)$' -test.benchtime=5x -test.v || fail=1
grep -h 'indexer query' "$OUT/query.txt" | sed 's/.*indexer_bench_test.go:[0-9]*: //' | awk '{k=$3" "$4} {last[k]=$0; if(!(k in seen)){seen[k]=1; order[++n]=k}} END{for(i=1;i<=n;i++) print last[order[i]]}'
# 3b. the new token-major query kernel's conformance (byte for byte against mlatest's reference, every batch shape,
#     MXFP4 and FP8, rotate both or neither; its own grid, and 2 / 3 blocks: runs across tokens).
step conf-tok 40 "$PKG" $B/cuda.test -test.run 'TestCUDAIndexerKernels/query=tok' -test.v -test.count=1 || fail=1
grep -E -- '--- (PASS|FAIL): TestCUDAIndexerKernels/query=tok[a-z0-9=,]* ' "$OUT/conf-tok.txt" | sed 's/^ *//'
echo "conf-tok subtests: $(grep -c -- '--- PASS' "$OUT/conf-tok.txt") pass, $(grep -c -- '--- FAIL' "$OUT/conf-tok.txt") fail"
grep -m6 -A6 -- '--- FAIL' "$OUT/conf-tok.txt" | cut -c1-300 | head -30
# 3c. the layer with indexer_query_tok (V4-Flash).
step layer-tok 14 "$R" $B/bench --indexer-only --indexer-no-topk --models flash --graph-reps 10 --indexer-batches none --indexer-ctx-tokens 4096,16384 --variant "iquery=7" --out "$OUT/layer-tok.json" || fail=1
modes layer-tok | grep -E ': (without the indexer|with its prologue|with its prologue but the query step|query step alone):'
# 4. Nsight Compute of the prefill query kernels at 4K rows.
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
for k in stream tok; do
  step ncu-$k 18 "$PKG" $NCU --clock-control none -k regex:indexer_query_$k -c 1 --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats $B/cuda.test -test.run '^$' -test.bench "^BenchmarkCUDAIndexer\$/query/prefill-4K/$k\$" -test.benchtime=1x
  grep -E 'Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issued Ipc|No Eligible|Warp Cycles Per Issued|L2 Hit|L1/TEX Hit|Grid Size|Waves' "$OUT/ncu-$k.txt" | sed -E 's/ +/ /g' | head -24
done
# 6. bf16 projection GEMM at prefill sizes.
step bf16 20 "$PKG" $B/cuda.test -test.run 'TestBF16GEMMTimes$' -bf16.times -bf16.times.rows 4096,16384 -bf16.times.variants cublaslt,cublaslt/h2,cublaslt/h3,wg -test.v || fail=1
grep -E 'BF16TIMES.*(r4|copy)' "$OUT/bf16.txt" | sed -E 's/ +/ /g' | head -36
# 8. the layer with the query path on the main stream (V4-Flash).
step layer-s1 15 "$R" $B/bench --indexer-only --indexer-no-topk --models flash --graph-reps 10 --indexer-batches none --indexer-ctx-tokens 4096,16384 --variant "istream=1" --out "$OUT/layer-s1.json" || fail=1
modes layer-s1
# 8b. the layer with the query's grid at 2 and 4 blocks a multiprocessor (V4-Flash).
for g in 2 4; do
  step layer-g$g 14 "$R" $B/bench --indexer-only --indexer-no-topk --models flash --graph-reps 10 --indexer-batches none --indexer-ctx-tokens 4096,16384 --variant "iqbpsm=$g" --out "$OUT/layer-g$g.json" || fail=1
  modes layer-g$g | grep -E ': (without the indexer|with its prologue|query step alone):'
done
# 5. nsys of the V4-Flash 4K layer graphs, if present.
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}" | tee -a "$LOG"
if [ -n "$NSYS" ]; then
  step nsys 30 "$R" $NSYS profile -o /tmp/iqp-nsys --force-overwrite true --trace cuda --cuda-graph-trace node $B/bench --indexer-only --indexer-no-topk --models flash --graph-reps 3 --indexer-batches none --indexer-ctx-tokens 4096 --out /tmp/iqp-nsys.json
  step nsys-stats 20 /tmp $NSYS stats --report cuda_gpu_kern_sum --format csv -o /tmp/iqp-kern /tmp/iqp-nsys.nsys-rep
  for f in /tmp/iqp-kern*.csv; do [ -f "$f" ] && gzip -c "$f" > "$OUT/$(basename $f).gz" && head -30 "$f" | cut -c1-220; done
fi
# 7. BenchmarkCUDAIndexerGEMMs at 4096 rows.
step gemms2 15 "$PKG" $B/cuda.test -test.run '^$' -test.bench '^BenchmarkCUDAIndexerGEMMs$/.*/m4096' -test.benchtime=3x -test.v || fail=1
grep -E 'us|Benchmark' "$OUT/gemms2.txt" | sed 's/.*indexer_bench_test.go:[0-9]*: //' | head -20
echo "=== done in $(( $(date +%s) - T0 )) s, fail=$fail" | tee -a "$LOG"
exit $fail
