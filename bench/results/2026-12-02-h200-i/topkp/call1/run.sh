#!/usr/bin/env bash
# topkp (issue 24, the top-k selection's share), at most ~98 s (END).
# Run from the repository root: bash .gpu-topkp/run.sh. Log: $OUT/topkp.log;
# raw outputs $OUT/*.log; a summary on stdout; exit 1 when a top-k test
# failed or did not finish.
#   0. warm: the top-k module compiled (NVRTC, fresh cache) by one graph test
#      with the default kernels.
#   1. TestCUDATopKConformance + TestCUDATopKGraph, one process a kernel
#      (every index against the CPU backend): the select kernels
#      topk_select4n (mma4u+select4n; its candidate sweep mma4+select4ns;
#      from global memory mma4+select4ng), topk_select5 (three radix passes:
#      mma4u+select5, its sweep mma4+select5s), topk_select5n (mma4u+select5n),
#      topk_select6 (select5 with a row's keys in registers: mma4u+select6);
#      and, last (5), the score kernels mma4v, mma4w.
#      (mma4v, mma4w: step 5, if time is left)
#   2. TestCUDATopKLarge: every kernel of topkKernels (the above too), the
#      1M-token scenarios included.
#   3. BenchmarkCUDATopK (best of 3 x 10 calls; the select alone is its own
#      10 launches): decode b=32 MTP 3 at 8K and 64K, prefill 16K, index_topk
#      512, with the select kernels above; the summary prints the select's
#      share of the layer.
#   4. ncu (time left): topk_select4n at prefill 16K; topk_select4 / 6 / 5 at
#      decode 8K (duration, occupancy, stalls).
set -u
D=.gpu-topkp
OUT=${OUT:-/tmp/topkp-out}
mkdir -p "$OUT"
LOG=$OUT/topkp.log
: >"$LOG"
END=${END:-98}
W=$(mktemp -d /tmp/tkp.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
C=$W/cuda.test
gunzip -c $D/cuda.test.gz >"$C" && chmod +x "$C"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 2)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "topkp: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. warm: TestCUDATopKGraph/mma4q+select4 (compiles the module)"
t=$(budget 30)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKGraph\$/^mma4q\+select4\$'" >"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s); $(grep -cF -- '--- PASS: TestCUDATopKGraph/mma4q+select4' "$W/tests.log") PASS"
[ $rc -eq 0 ] || { tail -8 "$W/tests.log" | tee -a "$LOG"; status=1; }

step "1. TestCUDATopK(Conformance|Graph), one process a kernel"
conf() { # kernels...
	for k in "$@"; do
	t=$(budget 9)
	if [ "$t" -lt 3 ]; then
		say "  $k: skipped (${t}s left)"
		[ "${OPTIONAL:-0}" = 1 ] || status=1
		continue
	fi
	re=$(printf '%s' "$k" | sed 's/+/\\+/g')
	timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)\$/^$re\$'" >"$W/t-$k.log" 2>&1
	rc=$?
	np=$(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/t-$k.log")
	nf=$(grep -cF -- "--- FAIL" "$W/t-$k.log")
	g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/$re " "$W/t-$k.log" | awk '{print $2}')
	say "  $k: rc $rc (timeout ${t}s); conformance $np PASS, $nf FAIL lines; graph ${g:-none}"
	if [ $rc -ne 0 ] || [ "$np" -lt 13 ] || [ "$g" != PASS ]; then
		status=1
		grep -E -B2 -A6 -- 'Error Trace|Error:|panic' "$W/t-$k.log" | head -16 | tee -a "$LOG"
	fi
	cat "$W/t-$k.log" >>"$W/tests.log"
done
}
conf mma4u+select4n mma4u+select5 mma4u+select6 mma4u+select5n mma4+select4ns mma4+select5s mma4+select4ng

step "2. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 34)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKLarge\$'" >"$W/large.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/large.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/large.log" | head -30 | tee -a "$LOG"
[ $rc -eq 0 ] || status=1
grep -q -- '--- FAIL' "$W/large.log" && status=1
for s in decode-b32-mtp3-8k/flash decode-b300/flash 1M/pro 1M-planted/flash decode-b32-mtp3-64k/flash prefill-256-at-8k/pro prefill-1024-at-2k/flash; do
	grep -qF -- "--- PASS: TestCUDATopKLarge/$s " "$W/large.log" || { say "Large $s not passed"; status=1; }
done
cat "$W/large.log" >>"$W/tests.log"

step "3a. BenchmarkCUDATopK decode 8K / 64K, index_topk 512"
t=$(budget 14)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3\$/^ctx=(8|64)K\$/^topk=512\$/^(mma4u\+select4|mma4u\+select5|mma4u\+select6|mma4u\+select4n|mma4u\+select5n)\$'" \
	>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
step "3b. BenchmarkCUDATopK prefill 16K, index_topk 512"
t=$(budget 12)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^prefill=16K\$/^topk=512\$/^(mma4u\+select4|mma4u\+select4n|mma4u\+select5n|mma4w\+select4n|mma4w\+select5n)\$'" \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' |
	awk '{ m = match($0, /select alone [0-9.]+/); s = substr($0, RSTART + 13, RLENGTH - 13); printf "%s  [select %.1f%% of the layer]\n", $0, 100 * s / $3 }' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
step "4. ncu ($NCU): topk_select4n at prefill 16K, topk_select4 and topk_select5 at decode 8K (the second launch)"
for ks in select4n:prefill=16K select4:decode-b32-mtp3$/^ctx=8K select6:decode-b32-mtp3$/^ctx=8K select5:decode-b32-mtp3$/^ctx=8K; do
	k=${ks%%:*}
	shape=${ks#*:}
	t=$(budget 12)
	if [ -z "$NCU" ] || [ "$t" -lt 8 ]; then
		say "  $k skipped (${t}s left)"
		continue
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$NCU' --clock-control none -k 'regex:^topk_$k\$' --launch-skip 1 -c 1 \
		--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section SchedulerStats \
		'$C' -test.run '^\$' -test.benchtime 1x \
		-test.bench '^BenchmarkCUDATopK\$/^$shape\$/^topk=512\$/^mma4u\+$k\$'" >"$W/ncu-$k.log" 2>&1
	say "  $k ($shape): rc $? (timeout ${t}s)"
	cat "$W/ncu-$k.log" >>"$OUT/ncu.log"
	grep -E '^  topk_select|Duration|Registers Per|Shared Memory Configuration Size|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Compute \(SM\) Throughput|Memory Throughput' "$W/ncu-$k.log" | sed -E 's/ {2,}/ /g' | head -20 | tee -a "$LOG"
done

step "5. TestCUDATopK(Conformance|Graph) with the score kernels mma4v, mma4w (time left)"
OPTIONAL=1 conf mma4w mma4v
cp "$W/tests.log" "$OUT/tests.log"

step "done: status $status (0: every top-k test passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: rc|not passed|skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|Duration|^rc|^=== |Error' "$LOG" | cut -c1-230
rm -rf "$W"
exit $status
