#!/usr/bin/env bash
# topk (issue 24), call of about 08:05 UTC: verify and time topk_score_mma4t
# and topk_score_mma4u against topk_score_mma4q (the default), at most ~98 s.
# Run from the repository root with .gpu-topk present: bash .gpu-topk/run.sh
# Log: $OUT/topk.log; raw outputs $OUT/*.log; a summary on stdout; exit 1 when
# a top-k test failed or did not finish.
#   0. (background) nvcc -arch=sm_90a -cubin -Xptxas -v --fmad=false on the
#      binary's topk.cu: registers/spills of every top-k kernel; cuobjdump
#      -sass of topk_score_mma4q / _mma4t / _mma4u ($OUT/sass.txt.gz).
#   1. TestCUDATopKConformance + TestCUDATopKGraph with mma4q, mma4t, mma4u
#      (every index against the CPU backend), TestCUDATopKLarge (every kernel
#      of topkKernels, the 1M-token scenarios included).
#   2. BenchmarkCUDATopK decode b=32 MTP 3 (random scales and -narrow) at 8K,
#      64K, 1M, index_topk 512: mma4q, mma4t, mma4u (each with the default
#      select, topk_select4). Then prefill=16K at index_topk 512 and 1024:
#      mma4q, mma4t. Best of 3 x 10 calls, two readings each.
#   4. (last, if time is left) immabench: the int8 mma.sync's rate and
#      dependent latency on this device (src/immabench.cu, registers only).
#   3. ncu (if time is left): topk_score_mma4t (with SourceCounters: the
#      SASS lines with the most stall samples, ncu-mma4t.top.txt) and
#      topk_score_mma4q at
#      decode 64K narrow (the exact path), the third launch of each.
set -u
D=.gpu-topk
C=$D/cuda.test
OUT=${OUT:-/tmp/topk-out}
mkdir -p "$OUT"
LOG=$OUT/topk.log
: >"$LOG"
END=${END:-98}
W=$(mktemp -d /tmp/tk.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
budget() { local l=$((END - SECONDS - 2)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "topk: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

NVCC=$(command -v nvcc || ls /usr/local/cuda*/bin/nvcc 2>/dev/null | head -1)
CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
(
	cd "$W" && cp "$OLDPWD/$D/src/"* . &&
		timeout 45 "$NVCC" -arch=sm_90a -cubin -Xptxas -v --fmad=false -std=c++17 -o topk.cubin topk.cu >nvcc.log 2>&1
	echo "nvcc rc $?" >>nvcc.log
	if [ -f topk.cubin ] && [ -n "$CUOBJ" ]; then
		timeout 15 "$CUOBJ" -sass topk.cubin >sass.all 2>&1
		awk '/Function : topk_score_mma4[qtu]$/{p=1} /Function : /&&!/topk_score_mma4[qtu]$/{p=0} p' sass.all | gzip -c >sass.txt.gz
		python3 "$OLDPWD/$D/sass_loops.py" topk_score_mma4q topk_score_mma4t topk_score_mma4u <sass.all >sass-loops.txt 2>&1
	fi
	timeout 25 "$NVCC" -arch=sm_90a -O3 -o immabench immabench.cu >>nvcc.log 2>&1
	echo "nvcc immabench rc $?" >>nvcc.log
) >/dev/null 2>&1 </dev/null &
NVPID=$!

step "1a. TestCUDATopK(Conformance|Graph) with mma4q, mma4t, mma4u"
t=$(budget 32)
timeout "$t" $C -test.v -test.count=1 -test.run 'TestCUDATopK(Conformance|Graph)$/^(mma4q|mma4t|mma4u)$' >"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
for k in mma4q mma4t mma4u; do
	say "  $k: conformance $(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/tests.log") PASS $(grep -cF -e "--- FAIL: TestCUDATopKConformance/$k/" "$W/tests.log") FAIL; graph $(grep -F -- "TestCUDATopKGraph/$k " "$W/tests.log" | grep -oE -- '--- (PASS|FAIL)' | awk '{print $2}')"
	grep -qF -- "--- PASS: TestCUDATopKGraph/$k " "$W/tests.log" || { say "  $k graph not verified"; status=1; }
	[ "$(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/tests.log")" -ge 13 ] || { say "  $k conformance incomplete"; status=1; }
done
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
step "1b. TestCUDATopKLarge (every kernel, 1M included)"
t=$(budget 18)
timeout "$t" $C -test.v -test.count=1 -test.run 'TestCUDATopKLarge$' >>"$W/tests.log" 2>&1
rc=$?
say "rc $rc (timeout ${t}s)"
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/tests.log" | tee -a "$LOG"
grep -E -B2 -A8 -- 'Error Trace|panic' "$W/tests.log" | head -40 | tee -a "$LOG"
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
for s in decode-b300/flash 1M/pro 1M-planted/flash decode-b32-mtp3-64k/flash decode-b32-mtp3-64k-narrow/pro; do
	grep -qF -- "--- PASS: TestCUDATopKLarge/$s " "$W/tests.log" || { say "Large $s not passed"; status=1; }
done
cp "$W/tests.log" "$OUT/tests.log"

step "2a. BenchmarkCUDATopK decode (best of 3 x 10 calls; two readings)"
t=$(budget 20)
timeout "$t" $C -test.run '^$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK$/^decode-b32-mtp3(-narrow)?$/^ctx=(8|64|1024)K$/^topk=512$/^(mma4q|mma4t|mma4u)$' \
	>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
step "2b. BenchmarkCUDATopK prefill 16K"
t=$(budget 8)
timeout "$t" $C -test.run '^$' -test.benchtime 3x \
	-test.bench '^BenchmarkCUDATopK$/^prefill=16K$/^topk=(512|1024)$/^(mma4q|mma4t|mma4u)$' \
	>>"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

step "0. nvcc (background): waiting"
for i in $(seq 1 "$(budget 12)"); do kill -0 $NVPID 2>/dev/null || break; sleep 1; done
kill -0 $NVPID 2>/dev/null && say "nvcc still running, not waited for"
cp "$W/nvcc.log" "$OUT/nvcc.log" 2>/dev/null
[ -f "$W/sass.txt.gz" ] && cp "$W/sass.txt.gz" "$OUT/sass.txt.gz"
[ -f "$W/sass-loops.txt" ] && cp "$W/sass-loops.txt" "$OUT/sass-loops.txt" && cat "$W/sass-loops.txt" | cut -c1-260 | tee -a "$LOG"
grep -E 'nvcc rc|error' "$W/nvcc.log" | head -5 | tee -a "$LOG"
grep -A3 -E "Compiling entry function 'topk_(score_mma4[pqtu]|select4)'" "$W/nvcc.log" | grep -vE '^--$' | tee -a "$LOG"

t=$(budget 6)
step "4. the int8 mma.sync rate and latency (immabench, registers only)"
if [ -x "$W/immabench" ] && [ "$t" -ge 3 ]; then
	timeout "$t" "$W/immabench" 2>&1 | tee -a "$LOG" >"$OUT/immabench.log"
else
	say "skipped (${t}s left, $(ls "$W/immabench" 2>&1))"
fi

NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
step "3. ncu ($NCU): topk_score_mma4q / _mma4t at decode 64K narrow, the third launch"
for k in mma4t mma4q; do
	t=$(budget 13)
	if [ -z "$NCU" ] || [ "$t" -lt 9 ]; then
		say "  $k skipped (${t}s left)"
		continue
	fi
	SRC=""
	[ $k = mma4t ] && SRC="--section SourceCounters"
	timeout "$t" "$NCU" --clock-control none -k "regex:^topk_score_$k\$" --launch-skip 2 -c 1 \
		--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section InstructionStats --section ComputeWorkloadAnalysis $SRC \
		--metrics sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active \
		--import-source no -f -o "$W/ncu-$k" \
		$C -test.run '^$' -test.benchtime 1x \
		-test.bench "^BenchmarkCUDATopK\$/^decode-b32-mtp3-narrow\$/^ctx=64K\$/^topk=512\$/^$k\$" >"$W/ncu-$k.out" 2>&1
	say "  $k: rc $? (timeout ${t}s)"
	[ -f "$W/ncu-$k.ncu-rep" ] || { tail -5 "$W/ncu-$k.out" | tee -a "$LOG"; continue; }
	timeout 10 "$NCU" -i "$W/ncu-$k.ncu-rep" --print-summary none --page details >"$W/ncu-$k.log" 2>&1
	cat "$W/ncu-$k.log" >>"$OUT/ncu.log"
	grep -E '^  topk_score|Duration|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|Stall [A-Z]|No Eligible|Achieved Occupancy|Executed Instructions |imma|pipe_fma|pipe_alu|inst_executed.sum' "$W/ncu-$k.log" | sed -E 's/ {2,}/ /g' | head -40 | tee -a "$LOG"
	if [ $k = mma4t ]; then
		timeout 10 "$NCU" -i "$W/ncu-$k.ncu-rep" --page source --csv --print-source sass >"$W/ncu-$k.src.csv" 2>/dev/null
		python3 $D/top_source.py 40 <"$W/ncu-$k.src.csv" >"$W/ncu-$k.top.txt" 2>&1
		cp "$W/ncu-$k.top.txt" "$OUT/"
		head -12 "$W/ncu-$k.top.txt" | cut -c1-200 | tee -a "$LOG"
	fi
done

kill $NVPID 2>/dev/null
step "done: status $status (0: every top-k test passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: conformance|not verified|incomplete|not passed|--- (PASS|FAIL): TestCUDATopKLarge |us a layer|Duration|Issue Slots Busy|^rc|^=== |Used [0-9]+ registers|^imma|^topk_score_mma4.: |  block ' "$LOG" | sed -E 's/; floors: cache [0-9]+ bytes/; floors: cache/' | cut -c1-200
exit $status
