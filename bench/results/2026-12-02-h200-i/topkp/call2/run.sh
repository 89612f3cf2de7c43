#!/usr/bin/env bash
# topkp (issue 24, the top-k selection's share), second call, at most ~98 s
# (END). Run from the repository root: bash .gpu-topkp/run.sh. Log:
# $OUT/topkp.log; raw outputs $OUT/*.log; a summary on stdout; exit 1 when
# a top-k test failed or did not finish (the sanitizers' steps count too).
# The binary is main's defaults since a768927: topk_select5 the default
# select, topk_select4n for launches of >= 1024 rows of <= 4,096 keys
# (cudatune SM90 TopKSelectNarrowMinRows).
#   0. warm: the module compiled by TestCUDATopKGraph with the defaults.
#   1. TestCUDATopKConformance + TestCUDATopKGraph with the defaults (mma4u:
#      topk_score_mma4u, topk_select5).
#   2. TestCUDATopKLarge: every kernel of topkKernels, the 1M-token
#      scenarios, prefill-1024-at-2k (with the defaults: the narrow rule,
#      topk_select4n).
#   3-4. BenchmarkCUDATopK, the defaults ("mma4u") against topk_select4
#      ("mma4u+select4", the default before) and topk_select5 alone
#      ("mma4u+select5": without the narrow rule): decode b=32 MTP 3 at 8K,
#      64K, 128K, 1M (index_topk 512) and 8K, 64K (1024); prefill 16K, 4K
#      and a 1K chunk at 3K (512 and 1024). Best of 3 x 10 calls, two
#      readings; the summary prints the select's share of the layer.
#   5. (last, time left) compute-sanitizer racecheck, then memcheck, over
#      the conformance with topk_select5 (mma4u), topk_select4n, topk_select6.
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

step "0. warm: TestCUDATopKGraph/mma4u (the defaults; compiles the module)"
t=$(budget 30)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKGraph\$/^mma4u\$'" >"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s); $(grep -cF -- '--- PASS: TestCUDATopKGraph/mma4u ' "$W/tests.log") PASS"
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
	g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/$re " "$W/t-$k.log" | awk '{print $2}' | tr -d :)
	say "  $k: rc $rc (timeout ${t}s); conformance $np PASS, $nf FAIL lines; graph ${g:-none}"
	if [ $rc -ne 0 ] || [ "$np" -lt 13 ] || [ "$g" != PASS ]; then
		status=1
		grep -E -B2 -A6 -- 'Error Trace|Error:|panic' "$W/t-$k.log" | head -16 | tee -a "$LOG"
	fi
	cat "$W/t-$k.log" >>"$W/tests.log"
done
}
conf mma4u

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

step "3. BenchmarkCUDATopK decode: defaults (mma4u) against topk_select4"
t=$(budget 20)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3\$/^ctx=(8|64|128|1024)K\$/^topk=512\$/^(mma4u|mma4u\+select4)\$'" \
	>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
t=$(budget 9)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^decode-b32-mtp3\$/^ctx=(8|64)K\$/^topk=1024\$/^(mma4u|mma4u\+select4)\$'" \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s; index_topk 1024)"
step "4. BenchmarkCUDATopK prefill 16K, 4K, chunk 1K at 3K: defaults, topk_select4, topk_select5"
t=$(budget 14)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK\$/^(prefill=16K|prefill=4K|chunk=1K-at-3K)\$/^topk=(512|1024)\$/^(mma4u|mma4u\+select4|mma4u\+select5)\$'" \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' |
	awk '{ m = match($0, /select alone [0-9.]+/); s = substr($0, RSTART + 13, RLENGTH - 13); printf "%s  [select %.1f%% of the layer]\n", $0, 100 * s / $3 }' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"
cp "$W/tests.log" "$OUT/tests.log"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in racecheck memcheck; do
	t=$(budget 22)
	[ $tool = memcheck ] && t=$(budget 14)
	step "5. $tool ($SAN): TestCUDATopKConformance with mma4u (topk_select5), mma4u+select4n, mma4u+select6"
	if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then
		say "skipped (${t}s left)"
		continue
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$SAN' --tool $tool --error-exitcode 9 '$C' -test.v -test.count=1 -test.run 'TestCUDATopKConformance\$/^(mma4u|mma4u\+select4n|mma4u\+select6)\$'" >"$W/$tool.log" 2>&1
	rc=$?
	say "rc $rc (timeout ${t}s: 124; errors: 9); $(grep -cE -- '--- PASS: TestCUDATopKConformance/[^/]+/' "$W/$tool.log") scenario PASS (39 if complete), $(grep -cE -- '--- FAIL' "$W/$tool.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds' "$W/$tool.log" | head -6 | tee -a "$LOG"
	cp "$W/$tool.log" "$OUT/$tool.log"
	[ $rc -eq 9 ] && status=1
	grep -q -- '--- FAIL' "$W/$tool.log" && status=1
done

step "done: status $status (0: every top-k test passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: rc|not passed|skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|SUMMARY|^rc|^=== |Error' "$LOG" | sed -E 's/; floors: cache [0-9.]+ us, int8 [0-9.]+ us \([0-9]+ row-entry pairs\)//' | cut -c1-200
rm -rf "$W"
exit $status
