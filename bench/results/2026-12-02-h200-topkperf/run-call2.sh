#!/usr/bin/env bash
# topkperf (issue 24): verify, time and profile the indexer top-k kernels.
# Run from the repository root with .gpu-topkperf carried: bash .gpu-topkperf/run.sh
# Within END seconds (default 145). Log: $OUT/topkperf.log (small, self-explaining);
# a short summary on stdout; exit 1 when a top-k test failed or did not finish.
# Steps, in priority order (each with its own timeout; skipped when no time is left):
#   1. TestCUDATopK(Conformance|Graph|Large) -short: every score kernel (mma, dp4a,
#      mma4, mma4p, mma4q) and select kernel (topk_select; topk_select2 with its keys in
#      shared memory, +select2, and from global memory, +select2g; topk_select3, whose
#      rows past its shared memory take a sampled candidate sweep, +select3, and with 40 KiB
#      so that the 64K rows take it, +select3s) against the CPU backend, every index.
#   2. ncu of topk_score_mma4 and topk_select at decode b=32 MTP 3, 64K, index_topk 512.
#   3. BenchmarkCUDATopK, decode b=32 MTP 3 (random and narrow scales), 8K..1M,
#      mma / mma4 / mma4p / mma4q / mma4q+select2 (and +select3 past 64K): "us a layer (score alone, select alone)" and the floors,
#      and each kernel's registers / spills / shared memory as loaded.
#   4. SASS resource usage and opcode counts of the loaded top-k cubin.
#   5. ncu of topk_score_mma4 at 8K, of topk_score_mma4q and topk_select2 at 64K, of mma4
#      at 64K narrow.
set -u
D=.gpu-topkperf
C=$D/cuda.test
OUT=${OUT:-/tmp/topkperf-out}
mkdir -p "$OUT"
LOG=$OUT/topkperf.log
: >"$LOG"
END=${END:-145}
W=$(mktemp -d /tmp/tkp.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
# budget S: S seconds, or what is left before END (less 3), at least 0.
budget() { local l=$((END - SECONDS - 3)); ((l < $1)) && echo $((l > 0 ? l : 0)) || echo "$1"; }
status=0
say "topkperf: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,memory.total --format=csv,noheader 2>&1 | head -2 | tee -a "$LOG"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
say "ncu: ${NCU:-none} $([ -n "$NCU" ] && $NCU --version 2>&1 | tail -1)"

step "1. TopK tests (-short: the 1M scenarios skipped)"
t=$(budget 40)
timeout "$t" $C -test.v -test.count=1 -test.short -test.run 'TestCUDATopK(Conformance|Graph|Large)$' >"$W/tests.log" 2>&1
rc=$?
cp "$W/tests.log" "$OUT/tests.log"
say "rc $rc (timeout ${t}s)"
for k in mma dp4a mma4 mma4p mma4q mma4+select2 mma4+select2g mma4+select3 mma4+select3s; do
	say "  $k: conformance $(grep -cF -- "--- PASS: TestCUDATopKConformance/$k/" "$W/tests.log") PASS $(grep -cF -e "--- FAIL: TestCUDATopKConformance/$k/" -e "--- FAIL: TestCUDATopKConformance/$k " "$W/tests.log") FAIL; graph $(grep -F -- "TestCUDATopKGraph/$k " "$W/tests.log" | grep -oE -- '--- (PASS|FAIL)' | awk '{print $2}')"
done
grep -E -- '^\s*--- (PASS|FAIL|SKIP): TestCUDATopKLarge' "$W/tests.log" | tee -a "$LOG"
grep -E -- '^--- (PASS|FAIL)|^(ok|FAIL|PASS)$' "$W/tests.log" | tee -a "$LOG"
grep -E -B2 -A6 -- 'Error Trace|panic|score kernel' "$W/tests.log" | head -40 | tee -a "$LOG"
if [ $rc -ne 0 ] || grep -q -- '--- FAIL' "$W/tests.log"; then status=1; fi
for k in mma4p mma4q mma4+select2 mma4+select2g mma4+select3 mma4+select3s; do
	grep -qF -- "--- PASS: TestCUDATopKGraph/$k " "$W/tests.log" || { say "$k not verified (tests skipped, failed or unfinished)"; status=1; }
done

SECTIONS="--section LaunchStats --section Occupancy --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section InstructionStats --section SourceCounters"
BENCH="-test.run ^$ -test.benchtime 1x -test.bench"
# prof NAME KERNEL_REGEX LAUNCHES BENCH_PATTERN SECS: profile, then print the
# sections, the stall breakdown and the hottest SASS lines of each kernel.
prof() {
	local name=$1 kre=$2 cnt=$3 pat=$4 sre=${6:-$2} t
	t=$(budget "$5")
	step "ncu $name ($kre, $pat)"
	if [ -z "$NCU" ]; then say "no ncu"; return; fi
	if [ "$t" -lt 8 ]; then say "skipped: ${t}s left"; return; fi
	timeout "$t" "$NCU" --clock-control none --target-processes all -k "regex:$kre" -c "$cnt" $SECTIONS \
		--import-source no -f -o "$W/$name" $C $BENCH "$pat" >"$W/$name.out" 2>&1
	say "ncu rc $? (timeout ${t}s); $(grep -E 'us a layer' "$W/$name.out" | sed -E 's/^.*_test.go:[0-9]+: //' | head -1)"
	grep -E '^==(PROF|ERROR|WARNING)==' "$W/$name.out" | grep -v 'Profiling "' | head -6 | tee -a "$LOG"
	[ -f "$W/$name.ncu-rep" ] || { tail -5 "$W/$name.out" | tee -a "$LOG"; return; }
	timeout 20 "$NCU" -i "$W/$name.ncu-rep" --print-summary none --page details 2>&1 |
		grep -vE '^\s*-{5,}' | sed -E 's/ {2,}/  /g' >>"$LOG"
	timeout 15 "$NCU" -i "$W/$name.ncu-rep" --page raw --csv 2>/dev/null >"$W/$name.raw.csv"
	python3 - "$W/$name.raw.csv" >>"$LOG" 2>&1 <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: print("raw page: nothing"); sys.exit()
hdr = rows[0]
for r in rows[2:]:
    k = r[hdr.index("Kernel Name")] if "Kernel Name" in hdr else "?"
    st = []
    for j, h in enumerate(hdr):
        if "issue_stalled_" in h and (h.endswith("_per_issue_active.ratio") or h.endswith("_per_warp_active.pct")):
            try: v = float(r[j].replace(",", ""))
            except ValueError: continue
            st.append((v, h.split("issue_stalled_")[1]))
    st.sort(reverse=True)
    print(f"stalls per issued instruction, {k}: " + ", ".join(f"{n} {v:.2f}" for v, n in st[:12] if v >= 0.01))
    for want in ("launch__registers_per_thread", "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
                 "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
                 "sm__pipe_tensor_op_imma_cycles_active.avg.pct_of_peak_sustained_active", "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
                 "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active", "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
                 "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "smsp__inst_executed.sum", "gpu__time_duration.sum",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__shared_mem_config_size"):
        if want in hdr: print(f"  {want} = {r[hdr.index(want)]}")
PY
	timeout 20 "$NCU" -i "$W/$name.ncu-rep" -k "regex:${sre}" --page source --csv --print-source sass 2>&1 >"$W/$name.src.csv" |
		head -3 >>"$LOG"
	python3 $D/top_source.py 30 <"$W/$name.src.csv" >>"$LOG" 2>&1
}

prof mma4-64k '^topk_(score_mma4|select)$' 2 '^BenchmarkCUDATopK$/^decode-b32-mtp3$/^ctx=64K$/^topk=512$/^mma4$' 35 '^topk_score_mma4$'

step "3. BenchmarkCUDATopK decode b=32 MTP 3, index_topk 512 (best of 3 x 10 calls; two readings)"
t=$(budget 65)
timeout "$t" $C -test.run '^$' -test.bench '^BenchmarkCUDATopK$/^decode-b32-mtp3(-narrow)?$/^ctx=(8|64|128|1024)K$/^topk=512$/^(mma|mma4|mma4p|mma4q|mma4q\+select[23])$' \
	-test.benchtime 3x >"$W/bench.log" 2>&1
say "rc $? (timeout ${t}s)"
cp "$W/bench.log" "$OUT/bench.log"
grep -E 'kernel [a-z0-9]+: |copy:' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | tee -a "$LOG"
grep -E 'us a layer' "$W/bench.log" | sed -E 's/^.*_test.go:[0-9]+: //; s/; floors: cache [0-9]+ bytes ([0-9.]+) us, int8 ([0-9.]+) us.*/; floors cache \1, int8 \2/' | sort -t/ -k2,2 -V | uniq | tee -a "$LOG"
grep -E 'FAIL|panic|Error' "$W/bench.log" | head -5 | tee -a "$LOG"

step "4. SASS of the top-k cubin"
CUBIN=$(grep -l topk_score_mma4p "$PROLOGUE_CACHE_DIR"/*.cubin "$PROLOGUE_CACHE_DIR"/*/*.cubin 2>/dev/null | head -1)
if [ -n "$CUBIN" ] && command -v cuobjdump >/dev/null; then
	cuobjdump --dump-resource-usage "$CUBIN" 2>&1 | grep -E 'Function|REG|STACK' | sed -E 's/ +/ /g' | tee -a "$LOG"
	for f in topk_score_mma4 topk_score_mma4p topk_score_mma4q topk_select topk_select2 topk_select3; do
		cuobjdump -sass -fun "$f" "$CUBIN" >"$W/$f.sass" 2>&1
		say "$f: $(grep -cE '^\s+/\*[0-9a-f]{4}\*/' "$W/$f.sass") instructions; opcodes: $(grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_]+' "$W/$f.sass" | awk '{print $NF}' | sort | uniq -c | sort -rn | head -24 | awk '{printf "%s %s, ", $2, $1}')"
	done
else
	say "no cubin in $PROLOGUE_CACHE_DIR or no cuobjdump: $(ls -R "$PROLOGUE_CACHE_DIR" 2>&1 | head -5 | tr '\n' ' ')"
fi

prof mma4-8k '^topk_score_mma4$' 1 '^BenchmarkCUDATopK$/^decode-b32-mtp3$/^ctx=8K$/^topk=512$/^mma4$' 20
prof mma4q-64k '^topk_(score_mma4q|select2)$' 2 '^BenchmarkCUDATopK$/^decode-b32-mtp3$/^ctx=64K$/^topk=512$/^mma4q\+select2$' 22 '^topk_score_mma4q$'
prof mma4-64k-narrow '^topk_score_mma4$' 1 '^BenchmarkCUDATopK$/^decode-b32-mtp3-narrow$/^ctx=64K$/^topk=512$/^mma4$' 20

step "6. ptxas -v on the build machine's NVRTC 11.8 PTX (the device compiles its own with NVRTC 12: step 3's 'kernel' lines and step 4 are the loaded code)"
t=$(budget 15)
if command -v ptxas >/dev/null && [ "$t" -ge 5 ]; then
	timeout "$t" ptxas -arch=sm_90 -v $D/topk-nvrtc11.ptx -o "$W/x.cubin" 2>&1 | grep -E 'Compiling entry|Used|spill' | sed -E 's/ptxas info *: //' | paste - - - | tee -a "$LOG"
else
	say "skipped (ptxas $(command -v ptxas || echo missing), ${t}s left)"
fi

step "done: status $status (0: every top-k test passed)"
echo "--- summary"
grep -E '^  [a-z0-9+]+: conformance|not verified|us a layer|stalls per issued|^=== ' "$LOG" | cut -c1-220
exit $status
