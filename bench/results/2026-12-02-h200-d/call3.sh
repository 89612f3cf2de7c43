#!/usr/bin/env bash
# 2026-12-02 call 3: the helpers' device scripts, then the coherent-load
# change (a6bb297): its kernels' tests and the chain's time before/after.
set -uo pipefail
export OUT
log=$OUT/lead.log
: >"$log"
say() { echo "$*" | tee -a "$log"; }
run_part() { # name limit cmd...
	local name=$1 lim=$2; shift 2
	local t0=$SECONDS
	say "=== $name (limit $lim s)"
	timeout --kill-after=5 "$lim" "$@" >"$OUT/$name.stdout" 2>&1
	local rc=$?
	say "=== $name rc=$rc ($((SECONDS - t0)) s)"
	tail -25 "$OUT/$name.stdout" >>"$log"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$log"
run_part wgmma 150 bash .gpu-wgmma/run.sh
run_part topkperf 140 bash .gpu-topkperf/run.sh
run_part idxbench 100 bash .gpu-idxbench/run.sh
L=.gpu-lead
t0=$SECONDS
say "=== lead: coherent loads, tests"
(cd attention/mla/cuda && timeout 70 ../../../$L/cuda.test -test.short -test.v -test.run 'GEMM|Compress|Indexer|ActQuant|NormQuant|TestCUDAConformance$' -test.skip 'Variants' 2>&1) >"$OUT/lead-tests.txt"
say "tests rc=$? ($((SECONDS - t0)) s): $(grep -c '^--- PASS' $OUT/lead-tests.txt) pass, $(grep -c -- '--- FAIL' $OUT/lead-tests.txt) fail"
grep -E -- "--- FAIL|^FAIL|panic" "$OUT/lead-tests.txt" | head -20 | tee -a "$log"
for v in before after; do
	b=.gpu-idxbench/bench
	[ "$v" = after ] && b=$L/bench
	t1=$SECONDS
	timeout 40 $b --chain-only --chain-compress=false --chain-batches 1,32 --mtp 3 --chain-ctx-tokens 4096 --graph-reps 20 --out "$OUT/chain-$v.json" >"$OUT/chain-$v.txt" 2>&1
	say "=== chain $v rc=$? ($((SECONDS - t1)) s)"
	grep -iE "chain|layer|us" "$OUT/chain-$v.txt" | grep -v "^#" | tail -12 >>"$log"
done
say "=== done at $SECONDS s"
# The call brings back a few files only: everything else in one archive.
(cd "$OUT" && tar czf all.tgz --exclude all.tgz --exclude lead.log . && find . -mindepth 1 ! -name all.tgz ! -name lead.log -delete)
