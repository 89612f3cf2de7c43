#!/usr/bin/env bash
# tsel (issue 24: the top-k select's share at decode 8K), round 2, at most
# ~146 s (END). Run from the repository root: bash .gpu-tsel/run.sh.
# Log: $OUT/tsel.log; raw outputs $OUT/*.log; a summary on stdout; exit 1
# when a top-k test failed or did not finish, or a sanitizer reported an error.
# The binary: the tsel branch (commit.txt) = main + the consolidation (only
# topk_score (dp4a), topk_score_mma4x, topk_select4n, topk_select5 left of
# the variants; topk_score_mma4xs of round 1 removed) + two select variants:
#   select5e: topk_select5 ending its radix select after the first pass
#             whose bin's keys are all taken (usually 2 passes of 3 at 8K);
#   select5h: select5e in 512-thread blocks.
# mma4x = main's defaults (mma4x + topk_select5, the narrow rule's
# topk_select4n): the baseline.
#   0. TestCUDATopKConformance + TestCUDATopKGraph with every kernel of
#      topkKernels (10; the first compiles the module cold).
#   1. BenchmarkCUDATopK: mma4x against mma4x+select5e, +select5h (decode
#      b=32 MTP 3 at 8K, 64K, random and narrow, 128K, 1M, 8K index_topk
#      1024, 8K in a 1M-token block table) and the prefill shapes with the
#      default (select4n there), +select5, +select5e.
#   2. compute-sanitizer memcheck, 3. TestCUDATopKLarge (every kernel),
#   4. racecheck: the conformance of mma4x+select5e and mma4x+select5h.
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
KS="dp4a mma4x mma4x+select4n mma4x+select4ns mma4x+select4ng mma4x+select5 mma4x+select5s mma4x+select5e mma4x+select5es mma4x+select5h"
say "tsel round 2: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. TestCUDATopK(Conformance|Graph), every kernel (cold compile first)"
t=$(budget 55)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)\$'" >"$W/conf.log" 2>&1
rc=$?
say "  rc $rc (timeout ${t}s)"
for k in $KS; do
	np=$(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/conf.log")
	nf=$(grep -cF -- "--- FAIL: TestCUDATopKConformance/$k/" "$W/conf.log")
	g=$(grep -oE -- "--- (PASS|FAIL): TestCUDATopKGraph/$k " "$W/conf.log" | awk '{print $2}' | tr -d :)
	say "  $k: conformance $np PASS (21 if complete), $nf FAIL; graph ${g:-none}"
	if [ "$np" -lt 21 ] || [ "$nf" -gt 0 ] || [ "${g:-none}" != PASS ]; then status=1; fi
done
[ $rc -ne 0 ] && status=1
grep -E -B2 -A8 -- 'Error Trace|Error:|panic' "$W/conf.log" | head -30 | tee -a "$LOG"
cp "$W/conf.log" "$OUT/conf.log"

step "1. BenchmarkCUDATopK"
: >"$W/bench.log"
bench() { # seconds, the benchmark's path below BenchmarkCUDATopK, the kernels
	local t
	t=$(budget "$1")
	if [ "$t" -lt 3 ]; then
		say "  $2: skipped (${t}s left)"
		return
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.run '^\$' -test.benchtime 3x -test.bench '^BenchmarkCUDATopK\$/$2/^($3)\$'" >>"$W/bench.log" 2>&1
	say "  rc $? (timeout ${t}s): $2"
}
DK='mma4x|mma4x\+select5e|mma4x\+select5h'
bench 10 '^decode-b32-mtp3(-narrow)?$/^ctx=(8|64)K$/^topk=512$' "$DK"
bench 5 '^decode-b32-mtp3$/^ctx=8K$/^topk=1024$' "$DK"
bench 6 '^decode-b32-mtp3-table=1M$/^ctx=8K$/^topk=512$' 'mma4x|mma4x\+select5e'
bench 6 '^decode-b32-mtp3$/^ctx=128K$/^topk=512$' "$DK"
bench 12 '^decode-b32-mtp3$/^ctx=1024K$/^topk=512$' "$DK"
bench 8 '^prefill=16K$/^topk=512$' 'mma4x|mma4x\+select5|mma4x\+select5e'
bench 6 '^prefill=16K-table=1M$/^rowkeys=false$/^topk=1024$' 'mma4x|mma4x\+select5e'
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes/; floors: cache/' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
san() { # tool, seconds, step number
	local tool=$1 t
	t=$(budget "$2")
	step "$3. $tool ($SAN): TestCUDATopKConformance/mma4x+select5e, +select5h"
	if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then
		say "skipped (${t}s left)"
		status=1
		return
	fi
	timeout "$t" bash -c "env -C attention/mla/cuda '$SAN' --tool $tool --error-exitcode 9 '$C' -test.v -test.count=1 -test.run 'TestCUDATopKConformance\$/^mma4x\\+select5(e|h)\$'" >"$W/$tool.log" 2>&1
	local rc=$?
	local ns
	ns=$(grep -cE -- '--- PASS: TestCUDATopKConformance/mma4x\+select5(e|h)/' "$W/$tool.log")
	say "rc $rc (timeout ${t}s: 124; errors: 9); $ns scenario PASS (42 if complete), $(grep -cE -- '--- FAIL' "$W/$tool.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds|ERROR' "$W/$tool.log" | head -6 | tee -a "$LOG"
	cp "$W/$tool.log" "$OUT/$tool.log"
	[ $rc -ne 0 ] && status=1
	[ "$ns" -lt 42 ] && status=1
}
san memcheck 22 2

step "3. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 30)
timeout "$t" bash -c "env -C attention/mla/cuda '$C' -test.v -test.count=1 -test.run 'TestCUDATopKLarge\$'" >"$W/large.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/large.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/large.log" | head -30 | tee -a "$LOG"
[ $rc -eq 0 ] || status=1
grep -q -- '--- FAIL' "$W/large.log" && status=1
grep -qF -- '--- PASS: TestCUDATopKLarge ' "$W/large.log" || status=1
cp "$W/large.log" "$OUT/large.log"

san racecheck 24 4

step "done: status $status (0: every top-k test passed, the sanitizers clean)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: |skipped|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|SUMMARY|^rc|^  rc|^=== |Error' "$LOG" | sed -E 's/; floors: cache [0-9.]+ us, int8 [0-9.]+ us \([0-9]+ row-entry pairs\)//' | cut -c1-220
rm -rf "$W"
exit $status
