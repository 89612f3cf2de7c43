#!/usr/bin/env bash
# tsel (issue 24: the top-k select's share at decode 8K), round 1, at most
# ~146 s (END). Run from the repository root: bash .gpu-tsel/run.sh.
# Log: $OUT/tsel.log; raw outputs $OUT/*.log; a summary on stdout; exit 1
# when a top-k test failed or did not finish, or a sanitizer reported an error.
# The binary: the tsel branch (commit.txt) = main + topk_score_mma4xs
# ("mma4xs": topk_score_mma4x launched in clusters of its tile blocks, each
# cluster selecting its 4 rows itself after a cluster barrier; rows of more
# than 8192 keys left to topk_select5x; no select kernel where the table
# has at most 8192 keys). mma4x (+ topk_select5) is main's default: the baseline.
#   0. TestCUDATopKConformance + TestCUDATopKGraph with mma4x and mma4xs
#      (the first compiles the module cold).
#   1. BenchmarkCUDATopK, mma4x (main's default) against mma4xs: decode
#      b=32 MTP 3 at 8K (random, narrow scales, index_topk 1024), 64K (random,
#      narrow), 1M; prefill 16K; a 1K chunk at 3K. Best of 3 x 10 calls.
#   2. compute-sanitizer memcheck over TestCUDATopKConformance/mma4xs.
#   3. TestCUDATopKLarge: every kernel (1M included; decode-8k-and-64k new).
#   4. racecheck over TestCUDATopKConformance/mma4xs (what time is left).
set -u
D=.gpu-tsel
OUT=${OUT:-/tmp/tsel-out}
mkdir -p "$OUT"
LOG=$OUT/tsel.log
: >"$LOG"
END=${END:-146}
W=/tmp/tsel
rm -rf "$W"
mkdir -p "$W"
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
C=$W/cuda.test
gunzip -c $D/cuda.test.gz >"$C" && chmod +x "$C"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 2)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "tsel round 1: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. TestCUDATopK(Conformance|Graph) with mma4x, mma4xs (cold compile first)"
t=$(budget 45)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)\$/^(mma4x|mma4xs)\$'" >"$W/conf.log" 2>&1
rc=$?
say "  rc $rc (timeout ${t}s)"
for k in mma4x mma4xs; do
	np=$(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/conf.log")
	nf=$(grep -cF -- "--- FAIL: TestCUDATopKConformance/$k/" "$W/conf.log")
	g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/$k " "$W/conf.log" | awk '{print $2}' | tr -d :)
	say "  $k: conformance $np PASS (21 if complete), $nf FAIL; graph ${g:-none}"
	if [ "$np" -lt 21 ] || [ "$nf" -gt 0 ] || [ "${g:-none}" != PASS ]; then status=1; fi
done
[ $rc -ne 0 ] && status=1
grep -E -B2 -A8 -- 'Error Trace|Error:|panic' "$W/conf.log" | head -30 | tee -a "$LOG"
cp "$W/conf.log" "$OUT/conf.log"

step "1. BenchmarkCUDATopK: mma4x (main's default) against mma4xs"
: >"$W/bench.log"
bench() { # seconds, then the benchmark's path below BenchmarkCUDATopK
	local t
	t=$(budget "$1")
	if [ "$t" -lt 3 ]; then
		say "  $2: skipped (${t}s left)"
		return
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x -test.bench '^BenchmarkCUDATopK\$/$2/^(mma4x|mma4xs)\$'" >>"$W/bench.log" 2>&1
	say "  rc $? (timeout ${t}s): $2"
}
bench 10 '^decode-b32-mtp3(-narrow)?$/^ctx=(8|64)K$/^topk=512$'
bench 4 '^decode-b32-mtp3$/^ctx=8K$/^topk=1024$'
bench 9 '^decode-b32-mtp3$/^ctx=1024K$/^topk=512$'
bench 6 '^prefill=16K$/^topk=512$'
bench 4 '^chunk=1K-at-3K$/^topk=512$'
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
san() { # tool, seconds
	local tool=$1 t
	t=$(budget "$2")
	step "$3. $tool ($SAN): TestCUDATopKConformance/mma4xs"
	if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then
		say "skipped (${t}s left)"
		status=1
		return
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$SAN' --tool $tool --error-exitcode 9 '$C' -test.v -test.count=1 -test.run 'TestCUDATopKConformance\$/^mma4xs\$'" >"$W/$tool.log" 2>&1
	local rc=$?
	local ns
	ns=$(grep -cE -- '--- PASS: TestCUDATopKConformance/mma4xs/' "$W/$tool.log")
	say "rc $rc (timeout ${t}s: 124; errors: 9); $ns scenario PASS (21 if complete), $(grep -cE -- '--- FAIL' "$W/$tool.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds|ERROR' "$W/$tool.log" | head -6 | tee -a "$LOG"
	cp "$W/$tool.log" "$OUT/$tool.log"
	[ $rc -ne 0 ] && status=1
	[ "$ns" -lt 21 ] && status=1
}
san memcheck 18 2

step "3. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 34)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKLarge\$'" >"$W/large.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/large.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/large.log" | head -30 | tee -a "$LOG"
[ $rc -eq 0 ] || status=1
grep -q -- '--- FAIL' "$W/large.log" && status=1
cp "$W/large.log" "$OUT/large.log"

san racecheck 22 4

step "done: status $status (0: every top-k test passed, the sanitizers clean)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: |not passed|skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|SUMMARY|^rc|^  rc|^=== |Error|clusters' "$LOG" | sed -E 's/; floors: cache [0-9.]+ us, int8 [0-9.]+ us \([0-9]+ row-entry pairs\)//' | cut -c1-220
rm -rf "$W"
exit $status
