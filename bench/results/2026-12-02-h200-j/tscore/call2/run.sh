#!/usr/bin/env bash
# tscore (issue 24: a faster score kernel for the top-k selection), round 2,
# at most ~118 s (END). Run from the repository root: bash .gpu-tscore/run.sh.
# Log: $OUT/tscore.log; raw outputs $OUT/*.log; a summary on stdout; exit 1
# when a top-k test of mma4x failed or did not finish, or a sanitizer
# reported an error.
# The binary: the tscore branch (commit.txt), topk_score_mma4x the default
# score kernel (cudatune SM90 TopKScore), its variants of round 1 removed.
#   0. TestCUDATopKConformance + TestCUDATopKGraph with mma4x (13 + 1; the
#      first compiles the module cold).
#   1. compute-sanitizer memcheck, then racecheck, over
#      TestCUDATopKConformance/mma4x (13 scenarios each).
#   2. TestCUDATopKLarge: every kernel of topkKernels, the 1M-token
#      scenarios.
#   3. BenchmarkCUDATopK, mma4x (the default) against mma4u (the default
#      before), each with the default select: decode b=32 MTP 3 at 8K,
#      64K, 128K, 1M (index_topk 512, random and narrow scales), 8K and 64K
#      (1024); prefill 16K (512, 1024), prefill 4K and a 1K chunk at 3K
#      (512). Best of 3 x 10 calls, two readings a kernel.
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
say "tscore round 2: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. TestCUDATopK(Conformance|Graph) with mma4x (cold compile first)"
t=$(budget 36)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)\$/^mma4x\$'" >"$W/conf.log" 2>&1
rc=$?
np=$(grep -cF -- "--- PASS: TestCUDATopKConformance/mma4x/" "$W/conf.log")
nf=$(grep -cF -- "--- FAIL" "$W/conf.log")
g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/mma4x " "$W/conf.log" | awk '{print $2}' | tr -d :)
say "  mma4x: rc $rc (timeout ${t}s); conformance $np PASS (13 if complete), $nf FAIL lines; graph ${g:-none}"
if [ $rc -ne 0 ] || [ "$np" -lt 13 ] || [ "$nf" -gt 0 ] || [ "${g:-none}" != PASS ]; then status=1; fi
grep -E -B2 -A8 -- 'Error Trace|Error:|panic' "$W/conf.log" | head -24 | tee -a "$LOG"
cp "$W/conf.log" "$OUT/conf.log"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for tool in memcheck racecheck; do
	t=$(budget 16)
	[ $tool = racecheck ] && t=$(budget 20)
	step "1. $tool ($SAN): TestCUDATopKConformance/mma4x"
	if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then
		say "skipped (${t}s left)"
		status=1
		continue
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$SAN' --tool $tool --error-exitcode 9 '$C' -test.v -test.count=1 -test.run 'TestCUDATopKConformance\$/^mma4x\$'" >"$W/$tool.log" 2>&1
	rc=$?
	ns=$(grep -cE -- '--- PASS: TestCUDATopKConformance/mma4x/' "$W/$tool.log")
	say "rc $rc (timeout ${t}s: 124; errors: 9); $ns scenario PASS (13 if complete), $(grep -cE -- '--- FAIL' "$W/$tool.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds|ERROR' "$W/$tool.log" | head -6 | tee -a "$LOG"
	cp "$W/$tool.log" "$OUT/$tool.log"
	[ $rc -ne 0 ] && status=1
	[ "$ns" -lt 13 ] && status=1
done

step "2. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 24)
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

step "3. BenchmarkCUDATopK: mma4x (the default) against mma4u"
: >"$W/bench.log"
bench() { # seconds, then the benchmark's path below BenchmarkCUDATopK
	local t
	t=$(budget "$1")
	if [ "$t" -lt 3 ]; then
		say "  $2: skipped (${t}s left)"
		return
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x -test.bench '^BenchmarkCUDATopK\$/$2/^(mma4u|mma4x)\$'" >>"$W/bench.log" 2>&1
	say "  rc $? (timeout ${t}s): $2"
}
bench 10 '^decode-b32-mtp3(-narrow)?$/^ctx=(8|64|128)K$/^topk=512$'
bench 9 '^decode-b32-mtp3(-narrow)?$/^ctx=1024K$/^topk=512$'
bench 5 '^decode-b32-mtp3$/^ctx=(8|64)K$/^topk=1024$'
bench 6 '^prefill=16K$/^topk=(512|1024)$'
bench 4 '^(prefill=4K|chunk=1K-at-3K)$/^topk=512$'
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

step "done: status $status (0: every top-k test of mma4x passed, both sanitizers clean)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: rc|not passed|skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|SUMMARY|^rc|^  rc|^=== |Error' "$LOG" | sed -E 's/; floors: cache [0-9.]+ us, int8 [0-9.]+ us \([0-9]+ row-entry pairs\)//' | cut -c1-200
rm -rf "$W"
exit $status
