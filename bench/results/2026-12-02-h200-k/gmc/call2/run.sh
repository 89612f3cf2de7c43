#!/bin/bash
# gmc round 2 (issue 25). Round 1 (17:56) showed the weight-sharing clusters correct where they ran but no faster, so
# this round (a) completes the conformance cut in round 1 and (b) splits the narrow kernel's time into a fixed cost
# and a cost a K block, to say where its time goes.
# Steps (each: timeout, output $OUT/<step>.txt, appended to $OUT/gmc.log; a global 145 s deadline):
#   warm    TestCUDAWGMMASmallShapes/narrow-pipe-wcast-4 (compiles the modules cold)
#   conf-*  in parallel: TestCUDAWGMMAGEMM under narrow-pipe-wcast-4, narrow-pipe-wcast-2 (round 1 cut both at 53 and
#           51 of 73 cases) and narrow-pipe-wcast-4-mc-2, each in two processes (shapes flash*/n256*, pro*)
#   times   TestGEMMTimes rows 1,32,128 at N 1536 and K 128, 512, 1024, 2048, 4096 (V4-Flash [wq_a; wkv]):
#           cublaslt wgmma-cluster wgmma-npipe (main's narrow-pipe plan) npipe-c4 npipe-c4-st4 npipe-c4-st8
#   ncu-*   one launch each: V4-Flash [wq_a; wkv] npipe-c4 m128, wgmma-cluster m128, the same N at K 128 (one K block:
#           the fixed cost alone) npipe-c4 m128, [wq_a; wkv] npipe-c4 m1, with the warp stall
#           reasons (smsp__average_warps_issue_stalled_*_per_issue_active)
# Read: "conf-*: N PASS, 0 FAIL"; TIMES lines "path shape/mN ran PATH cold X us b2b Y us"; ncu-* lines.
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
echo "# gmc round 2: binaries of $(cat $D/COMMIT), $(date -u +%FT%TZ)" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
mkdir -p $B && for f in cuda.test; do gunzip -c $D/$f.gz > $B/$f && chmod +x $B/$f || { echo "gunzip $f failed"; exit 1; }; done
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
  echo "$n: $(grep -c -- '--- PASS' $f) PASS, $(grep -c -- '--- FAIL' $f) FAIL, $(grep -c -- '--- SKIP' $f) SKIP; $(grep -c 'worst element' $f) cases within the bound; $(grep -E '^(ok|FAIL|PASS)' $f | head -1)"
  grep -m4 -B2 -A8 -- '--- FAIL' $f | grep -v -- '--- PASS' | cut -c1-240 | head -16
  grep -m3 -iE 'panic|trap|illegal|launch failed|Error Trace' $f | cut -c1-240
}
C="env -C attention/mla/cuda $B/cuda.test"
step warm 50 $C -test.v -test.count=1 -test.run 'TestCUDAWGMMASmallShapes/^narrow-pipe-wcast-4$'
count "$OUT/warm.txt"
pids=()
conf() { local name=$1; shift; step "$name" 48 "$@" & pids+=($!); }
for fin in narrow-pipe-wcast-4 narrow-pipe-wcast-2 narrow-pipe-wcast-4-mc-2; do
  conf conf-$fin-a $C -test.v -test.count=1 -test.run "TestCUDAWGMMAGEMM/^$fin\$/^(flash|n256)"
  conf conf-$fin-b $C -test.v -test.count=1 -test.run "TestCUDAWGMMAGEMM/^$fin\$/^pro"
done
for p in "${pids[@]}"; do wait $p || fail=1; done
for f in "$OUT"/conf-*.txt; do count $f; done
step times 30 $C -test.v -test.count=1 -test.run 'TestGEMMTimes' -gemm.times -gemm.times.rows 1,32,128 \
  -gemm.times.extra k128:1536:128,k512:1536:512,k1024:1536:1024,k2048:1536:2048 -gemm.times.shapes '^(flash-wqa-wkv|k[0-9]+)$' \
  -gemm.times.paths cublaslt,wgmma-cluster,wgmma-npipe,npipe-c4,npipe-c4-st4,npipe-c4-st8
grep '^TIMES' "$OUT/times.txt" | sed 's/  */ /g' | cut -d' ' -f2-8
for c in npipe-c4:128:flash-wqa-wkv wgmma-cluster:128:flash-wqa-wkv npipe-c4:128:k128 npipe-c4:1:flash-wqa-wkv; do
  IFS=: read p m sh <<< "$c"
  step ncu-$p-$sh-m$m 12 env -C attention/mla/cuda ncu --clock-control none -k regex:gemm_fp8_wgmma -c 1 --section SpeedOfLight \
    --section WarpStateStats --section LaunchStats --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
    $B/cuda.test -test.run TestGEMMTimes -gemm.times -gemm.times.rows $m -gemm.times.shapes "^$sh\$" -gemm.times.extra k128:1536:128 -gemm.times.paths $p
  grep -E 'Duration|Elapsed Cycles|SM Active Cycles|Grid Size|Cluster Size|Warp Cycles Per Issued|issue_stalled' "$OUT/ncu-$p-$sh-m$m.txt" | sed 's/  */ /g' | sed "s/^/ncu-$p-$sh-m$m:/"
done
echo "=== done in $(( $(date +%s) - T0 )) s, fail=$fail" | tee -a "$LOG"
exit $fail
