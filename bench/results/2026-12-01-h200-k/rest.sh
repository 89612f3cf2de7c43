#!/usr/bin/env bash
# The steps of run-gpu-tests.sh the 2026-12-01 23:05 run did not reach.
set -uo pipefail
fail=0
st() { echo "=== $(date +%T) $*"; timeout 150 "$@" 2>&1 | grep -E -- '^(--- FAIL|FAIL|ok|PASS|panic)|differ|ERROR SUMMARY|verify:|replayed|Error|error' | tail -12; rc=${PIPESTATUS[0]}; echo "=== exit $rc"; [ $rc -eq 0 ] || fail=1; }
st .gpu/decode --backend cuda --verify --summary-only --input hidden --trace .gpu/accept-chain.jsonl --layers 4
st .gpu/decode --backend cuda --verify --summary-only --input projected --graph=false --trace .gpu/accept.jsonl --layers 4
for tool in memcheck racecheck; do
st compute-sanitizer --tool $tool --error-exitcode 9 .gpu/cuda.test -test.short -test.run 'TestCUDACompressStep|TestCUDAIndexer'
st compute-sanitizer --tool $tool --error-exitcode 9 .gpu/cuda.test -test.short -test.run 'TestCUDATopK(Conformance|Graph)$'
done
st compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/tests.test -test.run 'TestHandoff/cuda'
echo "=== $(date +%T) done fail=$fail"
