#!/bin/bash
# idxq round 2: the indexer's query kernels at prefill sizes (issue 23).
#   stream = indexer_query_stream (the wide kernel's lanes, MXFP4 tail on bf16x2 pairs, next unit's loads in flight)
#   lane   = indexer_query_lane   (one lane a row, 32 rows a warp through shared memory by cp.async)
# Steps: (1) conformance: TestCUDAIndexerKernels/query=* (late, early, lean, wide, stream, lane)
#   (each kernel byte for byte against mlatest's reference at every batch shape, MXFP4 and FP8, and rotate both or
#   neither; ,maxblocks=2: every warp loops), TestNewTuned*; (2) BenchmarkCUDAIndexer, the query alone at
#   4 / 128 / 512 / 1024 / 2048 / 4096 / 16384 rows (20 calls a graph, best replay): lean, wide, stream, lane (own grid: 6 blocks an SM),
#   lane-g3 / lane-g12 (396 / 1584 blocks); (3) cmd/bench --indexer-only, V4-Flash
#   ratio-4 layer at b=32 MTP 3, 4K, 16K: main's defaults (wide from 128 rows), ilane=1024 (lane from 1024 rows),
#   iquery=5 (stream at every size). Log: $OUT/idxq.log; each step's output $OUT/<step>.txt (+ layer-*.json).
set -u
OUT=${OUT:-/tmp/idxq-out}
mkdir -p "$OUT"
LOG=$OUT/idxq.log
D=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$D/.." && pwd)
T0=$(date +%s)
fail=0
: > "$LOG"
echo "# idxq round 2: binaries of e48b4a304e9814a67c103ab857bbfcce04c80071, $(date -u +%FT%TZ)" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
gunzip -kf "$D/cuda.test.gz" "$D/bench.gz" && chmod +x "$D/cuda.test" "$D/bench" || { echo "gunzip failed"; exit 1; }
step() { # name timeout dir cmd...
  local name=$1 to=$2 dir=$3; shift 3
  local s=$(date +%s)
  echo "=== $name: $*" >> "$LOG"
  (cd "$dir" && timeout "$to" "$@") > "$OUT/$name.txt" 2>&1
  local rc=$?
  cat "$OUT/$name.txt" >> "$LOG"
  echo "=== $name rc=$rc ($(( $(date +%s) - s )) s of $to)" | tee -a "$LOG"
  return $rc
}
PKG=$R/attention/mla/cuda
step conformance 21 "$PKG" "$D/cuda.test" -test.run 'TestCUDAIndexerKernels/query=|TestNewTuned' -test.v -test.count=1 || fail=1
grep -E -- '--- (PASS|FAIL): TestCUDAIndexer(Query|Kernels)(/query=[a-z0-9=,]*)? ' "$OUT/conformance.txt" | sed 's/^ *//'
echo "conformance subtests: $(grep -c -- '--- PASS' "$OUT/conformance.txt") pass, $(grep -c -- '--- FAIL' "$OUT/conformance.txt") fail"
grep -m8 -A5 -- '--- FAIL' "$OUT/conformance.txt" | grep -v -- '--- PASS' | cut -c1-300 | head -40
for k in stream lane; do
  grep -q -- "--- PASS: TestCUDAIndexerKernels/query=$k " "$OUT/conformance.txt" && echo "conformance: query=$k PASS" || { echo "conformance: query=$k did not pass (skipped, cut or failed)"; fail=1; }
done
step kernels 24 "$PKG" "$D/cuda.test" -test.run '^$' -test.bench 'BenchmarkCUDAIndexer/query/(b1-mtp3|b32-mtp3|prefill-512|prefill-1K|prefill-2K|prefill-4K|prefill-16K)/(lean|wide|stream|lane|lane-g3|lane-g12)$' -test.benchtime=10x -test.v || fail=1
grep -h -m1 'copy:' "$OUT/kernels.txt" | sed 's/.*indexer_bench_test.go:[0-9]*: //'
grep -h 'indexer query' "$OUT/kernels.txt" | sed 's/.*indexer_bench_test.go:[0-9]*: //' | awk '{k=$3" "$4} {last[k]=$0; if(!(k in seen)){seen[k]=1; order[++n]=k}} END{for(i=1;i<=n;i++) print last[order[i]]}'
layer() { # name variant
  step layer-$1 12 "$R" "$D/bench" --indexer-only --indexer-no-topk --models flash --graph-reps 10 --indexer-batches 32 --indexer-ctx-tokens 4096,16384 --variant "$2" --out "$OUT/layer-$1.json" || fail=1
  awk -v pre="layer $1: " -f "$D/layersum.awk" "$OUT/layer-$1.txt"
}
layer default ""
layer lane "ilane=1024"
layer stream "iquery=5 iwide=16777216"
echo "=== done in $(( $(date +%s) - T0 )) s, fail=$fail" | tee -a "$LOG"
exit $fail
