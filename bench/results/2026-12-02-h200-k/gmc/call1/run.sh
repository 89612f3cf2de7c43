#!/bin/bash
# gmc round 1 (issue 25): the wgmma FP8 GEMM's token-chunk blocks of one weight tile sharing it through TMA
# multicast in thread-block clusters (Knobs.WGMMAWeightMulticast, "wcast"; off by default, main's routing unchanged).
# Steps (each: timeout, output $OUT/<step>.txt, appended to $OUT/gmc.log; a global 145 s deadline):
#   warm     TestCUDAWGMMASmallShapes under narrow-pipe-wcast-4 (compiles the modules cold; its cases count)
#   conf-*   in parallel: TestCUDAWGMMAGEMM (wide wcast-4, narrow-wcast-4, narrow-pipe-wcast-4, narrow-pipe-wcast-2),
#            TestCUDAWGMMANarrowGEMM (the narrow wcast families, and narrow-pipe-wcast-4-mc-2: clusters of 4 chunks x 2
#            tiles sharing W and X), TestCUDAWGMMAReplay (the five),
#            the rest of TestCUDAWGMMASmallShapes/wcast, TestCUDAGEMMGraph|Deterministic|Streams with
#            -cuda.wgnarrow=3 -cuda.wgchunks=4 -cuda.wgwcast=4
#   times    TestGEMMTimes rows 1,8,32,128, [wq_a; wkv] + indexer wq_b: cublaslt wgmma-cluster npipe-c4 (narrow-pipe,
#            4 chunks, no sharing) npipe-wc4 npipe-wc2 npipe-c2-wc2 narrow-wc4 npipe-wc4-mc2 narrow-wc4-mc2
#            (times-b: both wq_b, cublaslt wgmma-cluster npipe-wc4; last, cut first)
#   chain-*  cmd/bench --chain-only flash,pro b=32 MTP 3 with the compressor: main's defaults, then
#            "wgnarrow=3 wgchunks=4 wgwcast=4" (the narrow GEMMs at <= 128 rows on narrow-pipe sharing W), the same
#            with wgmc=2 (sharing X too; wgmc also lets wide one-chunk GEMMs share X)
#   ncu-*    Nsight Compute of one launch, V4-Flash [wq_a; wkv] m128: npipe-wc4, then npipe-c4
# Read: "conf-*: N PASS, 0 FAIL" lines; TIMES lines "path shape/mN ran PATH cold X us b2b Y us"; the chain lines.
set -u
export PATH=$PATH:/usr/local/cuda/bin
T0=$(date +%s)
END=$((T0 + 145))
OUT=${OUT:-/tmp/gmc-out}
mkdir -p "$OUT"
LOG=$OUT/gmc.log
R=$(pwd)
D=$R/.gpu-gmc
B=/tmp/gmc
fail=0
: > "$LOG"
echo "# gmc round 1: binaries of $(cat $D/COMMIT), $(date -u +%FT%TZ)" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
mkdir -p $B && for f in cuda.test bench; do gunzip -c $D/$f.gz > $B/$f && chmod +x $B/$f || { echo "gunzip $f failed"; exit 1; }; done
left() { echo $((END - $(date +%s))); }
step() {
  local name=$1 to=$2; shift 2
  local l=$(left); [ "$to" -gt "$l" ] && to=$l
  if [ "$to" -le 2 ]; then echo "=== $name skipped: out of time" | tee -a "$LOG"; fail=1; return 1; fi
  local s=$(date +%s)
  timeout "$to" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  { echo "=== $name: $*"; cat "$OUT/$name.txt"; echo "=== $name rc=$rc ($(( $(date +%s) - s )) s of $to)"; } >> "$LOG"
  echo "=== $name rc=$rc ($(( $(date +%s) - s )) s of $to)"
  [ $rc -eq 0 ] || fail=1
  return $rc
}
count() {
  local f=$1 n=$(basename $1 .txt)
  echo "$n: $(grep -c -- '--- PASS' $f) PASS, $(grep -c -- '--- FAIL' $f) FAIL, $(grep -c -- '--- SKIP' $f) SKIP; $(grep -E '^(ok|FAIL|PASS)' $f | head -1)"
  grep -m4 -B2 -A8 -- '--- FAIL' $f | grep -v -- '--- PASS' | cut -c1-240 | head -16
  grep -m3 -iE 'panic|trap|illegal|launch failed' $f | cut -c1-240
}
C="env -C attention/mla/cuda $B/cuda.test"
step warm 50 $C -test.v -test.count=1 -test.run 'TestCUDAWGMMASmallShapes/^narrow-pipe-wcast-4$'
count "$OUT/warm.txt"
pids=()
conf() { local name=$1; shift; step "$name" 40 "$@" & pids+=($!); }
conf conf-gemm-a $C -test.v -test.count=1 -test.run 'TestCUDAWGMMAGEMM/^(wcast-4|narrow-pipe-wcast-4)$'
conf conf-gemm-b $C -test.v -test.count=1 -test.run 'TestCUDAWGMMAGEMM/^(narrow-wcast-4|narrow-pipe-wcast-2)$'
conf conf-n $C -test.v -test.count=1 -test.run 'TestCUDAWGMMANarrowGEMM/wcast'
conf conf-replay $C -test.v -test.count=1 -test.run 'TestCUDAWGMMAReplay/wcast'
conf conf-small $C -test.v -test.count=1 -test.run 'TestCUDAWGMMASmallShapes/^(wcast-4|narrow-wcast-4|narrow-pipe-wcast-2|narrow-pipe-wcast-4-mc-2)$'
conf conf-knob $C -test.v -test.count=1 -cuda.wgnarrow=3 -cuda.wgchunks=4 -cuda.wgwcast=4 -test.run 'TestCUDAGEMMGraph|TestCUDAGEMMDeterministic|TestCUDAGEMMStreams'
for p in "${pids[@]}"; do wait $p || fail=1; done
for f in "$OUT"/conf-*.txt; do count $f; done
step times 40 $C -test.v -test.count=1 -test.run 'TestGEMMTimes' -gemm.times -gemm.times.rows 1,8,32,128 -gemm.times.shapes 'wqa-wkv|idx-wqb' \
  -gemm.times.paths cublaslt,wgmma-cluster,npipe-c4,npipe-wc4,npipe-wc2,npipe-c2-wc2,narrow-wc4,npipe-wc4-mc2,narrow-wc4-mc2
grep '^TIMES' "$OUT/times.txt" | sed 's/  */ /g' | cut -d' ' -f2-8
i=0
for v in "" "wgnarrow=3 wgchunks=4 wgwcast=4" "wgnarrow=3 wgchunks=4 wgwcast=4 wgmc=2"; do
  i=$((i + 1))
  n=$(echo "${v:-default}" | tr -d '= ')-$i
  to=10; [ $i -eq 1 ] && to=25
  step chain-$n $to $B/bench --chain-only --models flash,pro --chain-batches 32 --mtp 3 --chain-ctx-tokens none --graph-reps 10 --variant "$v" --out $OUT/chain-$n.json
  grep -E '^chain (flash|pro) ' "$OUT/chain-$n.txt" | grep -v "leave one" | sed 's/us\/layer with it.*/us\/layer/; s/GEMMs \([a-z]*\/[a-z]*\): *\([0-9.]*\) us\/layer.*/\1 \2/; s/  */ /g' | sed "s/^/$n: /"
done
for p in npipe-wc4 npipe-wc4-mc2 npipe-c4; do
  step ncu-$p 10 env -C attention/mla/cuda ncu --clock-control none -k regex:gemm_fp8_wgmma_n1p -c 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats $B/cuda.test -test.run TestGEMMTimes -gemm.times \
    -gemm.times.rows 128 -gemm.times.shapes '^flash-wqa-wkv$' -gemm.times.paths $p
  grep -E 'Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Memory Throughput|Compute \(SM\)|Grid Size|Cluster Size|L2 Hit|Warp Cycles Per Issued' "$OUT/ncu-$p.txt" | sed 's/  */ /g' | sed "s/^/ncu-$p:/"
done
step times-b 20 $C -test.v -test.count=1 -test.run 'TestGEMMTimes' -gemm.times -gemm.times.rows 1,8,32,128 -gemm.times.shapes '^(flash|pro)-wqb$' \
  -gemm.times.paths cublaslt,wgmma-cluster,npipe-wc4
grep '^TIMES' "$OUT/times-b.txt" | sed 's/  */ /g' | cut -d' ' -f2-8
echo "=== done in $(( $(date +%s) - T0 )) s, fail=$fail" | tee -a "$LOG"
exit $fail
