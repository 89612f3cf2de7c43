#!/usr/bin/env bash
# Runs every GPU test binary built by build-gpu-tests.sh, on the GPU machine:
# the driver tests, the CUDA conformance suite and mixed-batch test, the
# exhaustive e4m3 check, the cross-package tests (trace replay with
# --backend cuda --verify when available), and compute-sanitizer memcheck and
# racecheck over the conformance suite. Output also goes to $OUT/gpu-tests.log
# when OUT is set. Exits non-zero if any step fails.
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/gpu-tests.log
: >"$log"
fail=0
step() {
	echo "=== $*" | tee -a "$log"
	"$@" 2>&1 | tee -a "$log" | grep -E -- '^(=== RUN|--- FAIL|--- SKIP|FAIL|ok|PASS|panic)|cuda_test|differ|ERROR SUMMARY|device|Error|error|verify:|replayed|engine:|wall:|tokens:' | grep -v '^=== RUN' | tail -${TAIL:-40}
	local rc=${PIPESTATUS[0]}
	echo "=== exit $rc: $1" | tee -a "$log"
	[ "$rc" -eq 0 ] || fail=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee -a "$log"
step .gpu/driver.test -test.v
step .gpu/cuda.test -test.v -test.run 'Conformance|Mixed|Available'
step .gpu/cuda.test -test.v -test.run 'Exhaustive'
# The chain's FP8 GEMMs: conformance within package gemm's bound, per implementation.
step .gpu/cuda.test -test.v -test.run 'GEMM'
step env -C tests ../.gpu/tests.test -test.v
# The default trace end to end on the GPU, every byte compared with the CPU
# backend: through the CUDA-graph path (the default) and launch by launch.
step .gpu/decode --backend cuda --verify --summary-only
step .gpu/decode --backend cuda --verify --summary-only --graph=false --cache-format bf16 --q-format bf16
step .gpu/decode --backend cuda --verify --summary-only --cache-format fp8_pertensor --kv-scale 0.5 --model pro --layers 3
if command -v compute-sanitizer >/dev/null; then
	for tool in memcheck racecheck; do
		step compute-sanitizer --tool "$tool" --error-exitcode 9 .gpu/cuda.test -test.short -test.run 'TestCUDAConformance$'
	done
else
	echo "compute-sanitizer not found" | tee -a "$log"
	fail=1
fi
exit $fail
