#!/usr/bin/env bash
# topk (issue 24): verify and time topk_select4 / topk_select5 against the
# default pair (topk_score_mma4q + topk_select3), at most ~148 s (END).
# Run from the repository root with .gpu-topk carried: bash .gpu-topk/run.sh
# Log: $OUT/topk.log (raw test/bench output: $OUT/*.log); a short summary on
# stdout; exit 1 when a top-k test failed or did not finish.
#   1. TestCUDATopKConformance and TestCUDATopKGraph with mma4q (the
#      defaults) and the new select kernels: "mma4q+select4", "+select5",
#      "+select6" (select5 in 256-thread blocks) and "mma4+select4s" / 5s /
#      6s (40 KiB of shared memory: a 64K row takes the candidate sweep),
#      mma4+select5g / 6g (no shared memory: every row the global-memory way);
#      TestCUDATopKLarge (every kernel of
#      topkKernels, the 1M-token scenarios and 300 sequences included).
#      Every index against the CPU backend.
#   2. BenchmarkCUDATopK: decode b=32 MTP 3 (random scales, and -narrow)
#      at 8K, 64K, 128K, 1M, index_topk 512; prefill 16K at index_topk 512
#      and 1024; kernels mma4q (= topk_select3, the default), mma4q+select4,
#      mma4q+select5, mma4q+select6. Best of 3 x 10 calls, two readings. Summary lines:
#      "SHAPE KERNEL: whole W us (score alone S, select alone L) select share
#      L/W %".
#   3. compute-sanitizer racecheck over the conformance suite with select4,
#      select5, select6 and select5's sweep (their barriers are new).
#   4. Nsight Compute (if time is left): topk_select3, topk_select4 and
#      topk_select5 at decode 8K (launch stats, speed of light, warp states),
#      the third launch of each. Summary: "--- summary" at the end.
set -u
D=.gpu-topk
C=$D/cuda.test
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT"
LOG=$OUT/topk.log
: >"$LOG"
END=${END:-146}
W=$(mktemp -d /tmp/tk.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 2)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "topk: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"
K='mma4q|mma4q\+select[456]|mma4\+select[456]s|mma4\+select[56]g'

step "1a. TestCUDATopK(Conformance|Graph) with $K"
t=$(budget 40)
timeout "$t" $C -test.v -test.count=1 -test.run "TestCUDATopK(Conformance|Graph)\$/^($K)\$" >"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
for k in mma4q mma4q+select4 mma4q+select5 mma4q+select6 mma4+select4s mma4+select5s mma4+select6s mma4+select5g mma4+select6g; do
	say "  $k: conformance $(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/tests.log") PASS $(grep -cF -e "--- FAIL: TestCUDATopKConformance/$k/" "$W/tests.log") FAIL; graph $(grep -F -- "TestCUDATopKGraph/$k " "$W/tests.log" | grep -oE -- '--- (PASS|FAIL)' | awk '{print $2}')"
	grep -qF -- "--- PASS: TestCUDATopKGraph/$k " "$W/tests.log" || { say "  $k graph not verified"; status=1; }
done
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
step "1b. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 50)
timeout "$t" $C -test.v -test.count=1 -test.run 'TestCUDATopKLarge$' >>"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/tests.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/tests.log" | head -40 | tee -a "$LOG"
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
for s in decode-b300/flash 1M/pro 1M-planted/flash decode-b32-mtp3-64k/flash; do
	grep -qF -- "--- PASS: TestCUDATopKLarge/$s " "$W/tests.log" || { say "Large $s not passed"; status=1; }
done
cp "$W/tests.log" "$OUT/tests.log"

step "2. BenchmarkCUDATopK (best of 3 x 10 calls; two readings)"
t=$(budget 55)
timeout "$t" $C -test.run '^$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK$/^(decode-b32-mtp3(-narrow)?|prefill=16K)$/^(ctx=(8|64|128|1024)K|topk=(512|1024))$/^(topk=512|mma4q|mma4q\+select[456])$/^(mma4q|mma4q\+select[456])$' \
	>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -t/ -k2,2 -V | uniq | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"
say "--- select share (select alone / whole), best whole of the readings"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' |
	awk '{k=$1" "$2; w=$3; s=$9; sub(/,/,"",s); l=$12; sub(/\);/,"",l); if (!(k in best) || w < best[k]) {best[k]=w; sc[k]=s; se[k]=l}}
	END {for (k in best) printf "%s whole %.1f us (score alone %s, select alone %s) select share %.1f%%\n", k, best[k], sc[k], se[k], 100*se[k]/best[k]}' |
	sort -V | tee -a "$LOG"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
t=$(budget 22)
step "3. racecheck ($SAN), TestCUDATopKConformance/(mma4q+select4|5|6, mma4+select5s)"
if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then
	say "skipped (${t}s left)"
else
	timeout "$t" "$SAN" --tool racecheck --error-exitcode 9 $C -test.v -test.run 'TestCUDATopKConformance$/^(mma4q\+select[456]|mma4\+select5s)$' >"$W/racecheck.log" 2>&1
	say "rc $? (timeout ${t}s: 124; errors: 9); $(grep -cE -- '--- PASS: TestCUDATopKConformance/[^/]+/' "$W/racecheck.log") scenario PASS, $(grep -cE -- '--- FAIL' "$W/racecheck.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds' "$W/racecheck.log" | head -6 | tee -a "$LOG"
	cp "$W/racecheck.log" "$OUT/racecheck.log"
fi

NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
step "4. ncu ($NCU): topk_select3/4/5 at decode 8K, the third launch of each"
: >"$W/ncu.log"
for k in mma4q:topk_select3 'mma4q\+select4:topk_select4' 'mma4q\+select5:topk_select5'; do
	t=$(budget 12)
	if [ -z "$NCU" ] || [ "$t" -lt 8 ]; then
		say "  ${k#*:} skipped (${t}s left)"
		continue
	fi
	timeout "$t" "$NCU" --clock-control none -k "${k#*:}" --launch-skip 2 -c 1 \
		--section LaunchStats --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
		$C -test.run '^$' -test.benchtime 1x \
		-test.bench "^BenchmarkCUDATopK\$/^decode-b32-mtp3\$/^ctx=8K\$/^topk=512\$/^${k%%:*}\$" >>"$W/ncu.log" 2>&1
	say "  ${k#*:}: rc $? (timeout ${t}s)"
done
cp "$W/ncu.log" "$OUT/ncu.log"
grep -E '^  topk_select[345]|Duration|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Stall|No Eligible|Elapsed Cycles|Achieved Occupancy' "$W/ncu.log" | head -60 | tee -a "$LOG"

step "done: status $status (0: every top-k test passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: conformance|not verified|not passed|--- (PASS|FAIL): TestCUDATopKLarge |select share|SUMMARY|^rc|^=== ' "$LOG" | cut -c1-220
exit $status
