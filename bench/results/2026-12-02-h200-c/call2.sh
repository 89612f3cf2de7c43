#!/usr/bin/env bash
# 2026-12-02 call 2: the conformance suite (trimmed of the knob variants,
# the large context and the second bf16 GEMM pass) and the engine's verify
# on main after common.cuh, the ABI structs of every kernel and the fused
# projection; the rewrite's replay variants.
set -uo pipefail
log=$OUT/lead.log
: >"$log"
fail=0
step() {
	echo "=== $*" | tee -a "$log"
	local t0=$SECONDS
	timeout "${STEP_TIMEOUT:-200}" "$@" >>"$log" 2>&1
	local rc=$?
	echo "=== exit $rc ($((SECONDS - t0)) s): $*" | tee -a "$log"
	[ "$rc" -eq 0 ] || fail=1
}
C="env -C attention/mla/cuda ../../../.gpu/cuda.test"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$log"
step .gpu/driver.test -test.v
step $C -test.v -test.run 'Conformance|Mixed|Available|AsyncWrite' -test.skip 'TestCUDAConformanceVariants'
step $C -test.v -test.run 'Exhaustive'
step $C -test.v -test.run 'Compress'
step $C -test.v -test.run 'Indexer'
step $C -test.v -test.run 'TestCUDATopK'
step .gpu/cublaslt.test -test.v
step $C -test.v -test.run 'GEMM'
step env -C tests ../.gpu/tests.test -test.v
step .gpu/decode --backend cuda --verify --summary-only --input projected
step .gpu/decode --backend cuda --verify --summary-only --input hidden
step .gpu/decode --backend cuda --verify --summary-only --input hidden --graph=false --cache-format bf16 --q-format bf16
step .gpu/decode --backend cuda --verify --summary-only --input hidden --model pro --layers 3
STEP_TIMEOUT=60 step $C -test.v -test.run TestCUDAGEMMChainReplay -gemm.rewrite
echo "--- failures:" | tee -a "$log"
grep -E "^(--- FAIL|    --- FAIL|FAIL|panic)|differs|verify:.*(FAIL|differ)" "$log" | head -40
grep -E "^    gemm_replay_test.go:.*rewrite-508f76b|^--- |^    --- " "$log" | grep -E "Replay|rewrite" | head -30
echo "fail=$fail"
exit $fail
