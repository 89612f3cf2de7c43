#!/usr/bin/env bash
# 2026-12-02 call 4 (the last): the helpers' second scripts, then main's
# final check: the indexer query's four rows a warp (ef7ccb7), top-k, the
# engine's verify, the indexer bench.
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
L=.gpu-lead
step() { # limit cmd...
	local lim=$1; shift
	local t0=$SECONDS
	timeout --kill-after=3 "$lim" "$@" >>"$OUT/lead-final.txt" 2>&1
	say "=== rc=$? ($((SECONDS - t0)) s): $*"
}
: >"$OUT/lead-final.txt"
step 40 env -C attention/mla/cuda ../../../$L/cuda.test -test.v -test.run 'TestCUDAIndexer|TestCUDATopK|TestCUDAConformance$|TestCUDACompressStep'

step 30 $L/decode --backend cuda --verify --summary-only --input hidden
step 40 $L/decode --backend cuda --verify --summary-only --input hidden --model pro --layers 3
step 30 $L/decode --backend cuda --verify --summary-only --input projected --graph=false
step 25 .gpu-idxbench/bench --indexer-only --models flash --graph-reps 20 --out "$OUT/idx-flash.json"
grep -E -- "^--- FAIL|^FAIL|panic|^verify:|^indexer|^\| flash" "$OUT/lead-final.txt" | head -40 | tee -a "$log"
say "lead final: $(grep -c '^--- PASS' $OUT/lead-final.txt) pass, $(grep -c -- '--- FAIL' $OUT/lead-final.txt) fail"
run_part wgmma 150 bash .gpu-wgmma/run.sh
run_part topkperf 120 bash .gpu-topkperf/run.sh
run_part idxbench 60 bash .gpu-idxbench/run.sh
say "=== done at $SECONDS s"
(cd "$OUT" && tar czf /tmp/all.tgz . && mv /tmp/all.tgz all.tgz && find . -mindepth 1 ! -name all.tgz ! -name lead.log -delete)
