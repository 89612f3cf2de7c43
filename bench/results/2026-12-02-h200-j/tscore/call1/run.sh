#!/usr/bin/env bash
# tscore (issue 24: a faster score kernel for the top-k selection), round 1,
# at most ~118 s (END). Run from the repository root: bash .gpu-tscore/run.sh.
# Log: $OUT/tscore.log; raw outputs $OUT/*.log; a summary on stdout; exit 1
# when a top-k test of the new kernels failed or did not finish.
# The binary: the tscore branch (commit.txt): five new score kernels, every
# one mma4w's integer dots and float32 order (the same keys):
#   mma4x   topk_score_mma4x: blocks of 8 warps (2 a multiprocessor), the
#           query copied in 16-byte chunks, two blocks' B fragments a
#           16-byte load, the exact path's fl(-w M) set once a pass;
#   mma4y   the same in blocks of 4 warps (4 a multiprocessor);
#   mma4z   mma4x with its exact loop software-pipelined;
#   mma4xe  mma4x with a pass's first tile copied before its setup;
#   mma4ze  mma4z likewise.
#   0. TestCUDATopKConformance + TestCUDATopKGraph with the five (one
#      process: its first test compiles the module cold).
#   1. TestCUDATopKLarge: every kernel of topkKernels (these three included),
#      the 1M-token scenarios.
#   2. BenchmarkCUDATopK: decode b=32 MTP 3 at 8K, 64K, 128K, index_topk
#      512, random scales and narrow ones: mma4u (the default), mma4w and
#      the five; prefill 16K (512): mma4u, mma4x, mma4xe, mma4z; each with
#      the default select.
#      Best of 3 x 10 calls, two readings a kernel.
#   3. (time left, optional) ncu of mma4x, mma4ze, mma4u at 64K narrow.
set -u
D=.gpu-tscore
OUT=${OUT:-/tmp/tscore-out}
mkdir -p "$OUT"
LOG=$OUT/tscore.log
: >"$LOG"
END=${END:-118}
W=$(mktemp -d /tmp/tsc.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
C=$W/cuda.test
gunzip -c $D/cuda.test.gz >"$C" && chmod +x "$C"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 2)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
NEW="mma4x mma4y mma4z mma4xe mma4ze"
say "tscore: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. TestCUDATopK(Conformance|Graph) with $NEW (cold compile first)"
t=$(budget 52)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)\$/^(mma4x|mma4y|mma4z|mma4xe|mma4ze)\$'" >"$W/conf.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
for k in $NEW; do
	np=$(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/conf.log")
	nf=$(grep -cF -- "--- FAIL: TestCUDATopKConformance/$k" "$W/conf.log")
	g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/$k " "$W/conf.log" | awk '{print $2}' | tr -d :)
	say "  $k: conformance $np PASS (13 if complete), $nf FAIL lines; graph ${g:-none}"
	if [ "$np" -lt 13 ] || [ "$nf" -gt 0 ] || [ "${g:-none}" != PASS ]; then status=1; fi
done
[ $rc -eq 0 ] || status=1
grep -E -B2 -A8 -- 'Error Trace|Error:|panic' "$W/conf.log" | head -24 | tee -a "$LOG"
cp "$W/conf.log" "$OUT/conf.log"

step "1. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 30)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKLarge\$'" >"$W/large.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/large.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/large.log" | head -30 | tee -a "$LOG"
[ $rc -eq 0 ] || status=1
grep -q -- '--- FAIL' "$W/large.log" && status=1
for s in decode-b32-mtp3-8k/flash decode-b32-mtp3-8k-narrow/flash decode-b300/flash 1M/pro 1M-planted/flash decode-b32-mtp3-64k/flash decode-b32-mtp3-64k-narrow/pro prefill-256-at-8k/pro prefill-1024-at-2k/flash mixed/flash; do
	grep -qF -- "--- PASS: TestCUDATopKLarge/$s " "$W/large.log" || { say "Large $s not passed"; status=1; }
done
cp "$W/large.log" "$OUT/large.log"

step "2. BenchmarkCUDATopK: decode 8K/64K/128K (random, narrow), prefill 16K; mma4u mma4w $NEW"
K='(mma4u|mma4w|mma4x|mma4y|mma4z|mma4xe|mma4ze)'
t=$(budget 15)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3(-narrow)?\$/^ctx=(8|64)K\$/^topk=512\$/^$K\$'" \
	>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s; 8K, 64K)"
t=$(budget 9)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3(-narrow)?\$/^ctx=128K\$/^topk=512\$/^$K\$'" \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s; 128K)"
t=$(budget 7)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^prefill=16K\$/^topk=512\$/^(mma4u|mma4x|mma4xe|mma4z)\$'" \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s; prefill 16K)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
for k in mma4x mma4ze mma4u; do
	t=$(budget 14)
	step "3. (optional) ncu $k, decode 64K narrow, the fourth launch"
	if [ -z "$NCU" ] || [ "$t" -lt 10 ]; then
		say "skipped (${t}s left)"
		continue
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$NCU' --clock-control none -k regex:topk_score_$k --launch-skip 3 -c 1 \
		--section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
		'$C' -test.run '^\$' -test.benchtime 1x -test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3-narrow\$/^ctx=64K\$/^topk=512\$/^$k\$'" >"$W/ncu-$k.log" 2>&1
	say "rc $? (timeout ${t}s)"
	grep -E 'Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps Per|Registers Per|Achieved Occupancy|Theoretical Occupancy|Executed Instructions  |Block Limit' "$W/ncu-$k.log" | head -16 | tee -a "$LOG"
	cp "$W/ncu-$k.log" "$OUT/ncu-$k.log"
done

step "done: status $status (0: every top-k test of $NEW passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: conf|not passed|skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|^rc|^=== |Error|Duration|Issue Slots' "$LOG" | sed -E 's/; floors: cache [0-9.]+ us, int8 [0-9.]+ us \([0-9]+ row-entry pairs\)//' | cut -c1-200
rm -rf "$W"
exit $status
