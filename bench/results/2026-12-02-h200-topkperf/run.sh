#!/usr/bin/env bash
# topkperf final call (issue 24): verify and time the top-k kernels, at most ~100 s.
# Run from the repository root with .gpu-topkperf carried: bash .gpu-topkperf/run.sh
# (at most 108 s: END; the steps after the tests and the benchmark get what is left)
# Log: $OUT/topkperf.log; a short summary on stdout; exit 1 when a top-k test failed
# or did not finish. (run-call2.sh is the 02:51 call's profiling script.)
#   1. TestCUDATopK(Conformance|Graph|Large), NOT -short (the 1M-token scenarios
#      included): every score kernel (mma, dp4a, mma4, mma4p, mma4q = the new default,
#      mma4r, mma4s) and select kernel (topk_select = "radix"; topk_select2; topk_select3 = the
#      new default, and "select3s", whose 64K rows take its candidate sweep) against the
#      CPU backend, every index.
#   2. BenchmarkCUDATopK decode b=32 MTP 3 (random and narrow scales) 8K..1M:
#      mma4+radix (the old default pair), mma4q (new default, with topk_select3), mma4r,
#      mma4s: "us a layer (score alone, select alone)".
#   3. compute-sanitizer racecheck and memcheck over the conformance suite, new kernels.
set -u
D=.gpu-topkperf
C=$D/cuda.test
OUT=${OUT:-/tmp/topkperf-out}
mkdir -p "$OUT"
LOG=$OUT/topkperf.log
: >"$LOG"
END=${END:-108}
W=$(mktemp -d /tmp/tkp.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 3)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "topkperf final: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "1. TopK tests (the 1M scenarios included)"
t=$(budget 62)
# (mma and dp4a, unchanged and verified in the 02:51 call, run in TestCUDATopKLarge only)
timeout "$t" $C -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph|Large)$/^(mma4[pqrs]?|mma4\+select[23][gs]?|decode-.*|prefill-.*|mixed|1M.*)$' >"$W/tests.log" 2>&1
rc=$?
cp "$W/tests.log" "$OUT/tests.log"
say "rc $rc (timeout ${t}s)"
for k in mma4 mma4p mma4q mma4r mma4s mma4+select2 mma4+select2g mma4+select3 mma4+select3s; do
	say "  $k: conformance $(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/tests.log") PASS $(grep -cF -e "--- FAIL: TestCUDATopKConformance/$k/" -e "--- FAIL: TestCUDATopKConformance/$k " "$W/tests.log") FAIL; graph $(grep -F -- "TestCUDATopKGraph/$k " "$W/tests.log" | grep -oE -- '--- (PASS|FAIL)' | awk '{print $2}')"
done
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/tests.log" | tee -a "$LOG"
grep -E -- '^--- (PASS|FAIL)|^(ok|FAIL|PASS)$' "$W/tests.log" | tee -a "$LOG"
grep -E -B2 -A6 -- 'Error Trace|panic|score kernel' "$W/tests.log" | head -40 | tee -a "$LOG"
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
for k in mma4p mma4q mma4r mma4s mma4+select2 mma4+select2g mma4+select3 mma4+select3s; do
	grep -qF -- "--- PASS: TestCUDATopKGraph/$k " "$W/tests.log" || { say "$k not verified (tests skipped, failed or unfinished)"; status=1; }
done
grep -qE -- '--- PASS: TestCUDATopKLarge/1M/pro ' "$W/tests.log" || { say "1M/pro not passed"; status=1; }
grep -qE -- '--- PASS: TestCUDATopKLarge/1M-planted/flash ' "$W/tests.log" || { say "1M-planted not passed"; status=1; }

step "2. BenchmarkCUDATopK (best of 3 x 10 calls; two readings)"
t=$(budget 24)
timeout "$t" $C -test.run '^$' -test.bench '^BenchmarkCUDATopK$/^decode-b32-mtp3(-narrow)?$/^ctx=(8|64|128|1024)K$/^topk=512$/^(mma4\+radix|mma4q|mma4r|mma4s)$' \
	-test.benchtime 3x >"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes ([0-9.]+) us, int8 ([0-9.]+) us.*/; floors cache \1, int8 \2/' | sort -t/ -k2,2 -V | uniq | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

# 3. The sanitizers over the conformance suite with the new defaults (what time is left):
#    racecheck (mma4q with topk_select3, and topk_select3's candidate sweep: shared-memory
#    hazards of the cp.async buffers and the gathers), then memcheck (mma4q).
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
for spec in "racecheck 20 ^(mma4q|mma4\+select3s)$" "memcheck 16 ^mma4q$"; do
	set -- $spec
	tool=$1
	t=$(budget $2)
	step "3. $tool ($SAN), TestCUDATopKConformance/$3"
	if [ -z "$SAN" ] || [ "$t" -lt 8 ]; then say "skipped (${t}s left)"; continue; fi
	timeout "$t" "$SAN" --tool $tool --error-exitcode 9 $C -test.v -test.run "TestCUDATopKConformance\$/$3" >"$W/$tool.log" 2>&1
	say "rc $? (timeout ${t}s: 124; errors: 9); $(grep -cE -- '--- PASS: TestCUDATopKConformance/[^/]+/' "$W/$tool.log") scenario PASS, $(grep -cE -- '--- FAIL' "$W/$tool.log") FAIL"
	grep -E 'SUMMARY|Hazard|Invalid|out of bounds' "$W/$tool.log" | head -6 | tee -a "$LOG"
	cp "$W/$tool.log" "$OUT/$tool.log"
done

step "done: status $status (0: every top-k test passed, the 1M ones included)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: conformance|not verified|not passed|1M|us a layer|SUMMARY|^rc|^=== ' "$LOG" | cut -c1-200
exit $status
