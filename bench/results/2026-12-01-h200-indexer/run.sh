#!/usr/bin/env bash
# The indexer's GPU checks: conformance, benchmarks, compute-sanitizer.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
t() { local s=$(date +%s); local to=$1 name=$2; shift 2; timeout "$to" "$@" >"$OUT/$name.log" 2>&1; echo "== $name exit $? in $(( $(date +%s) - s )) s"; }
t 45 conformance ./cuda.test -test.v -test.run 'TestCUDAIndexer|TestCUDACompressStep'
grep -E '^(--- |FAIL|ok|PASS|panic)' "$OUT/conformance.log" | head; grep -c -- '    --- PASS' "$OUT/conformance.log"; grep -E -- '--- FAIL' -A10 "$OUT/conformance.log" | head -40
t 60 bench ./cuda.test -test.run XXX -test.bench 'CUDAIndexer' -test.benchtime 5x
grep -E 'Benchmark|us a layer|copy:|wq_b|projection' "$OUT/bench.log" | head -40
t 35 memcheck-query compute-sanitizer --tool memcheck --error-exitcode 9 ./cuda.test -test.v -test.run 'TestCUDAIndexer'
grep -E 'ERROR SUMMARY|^(--- |FAIL|ok|PASS)' "$OUT/memcheck-query.log" | head -5
t 45 memcheck-keys compute-sanitizer --tool memcheck --error-exitcode 9 ./cuda.test -test.v -test.run 'TestCUDACompressStep/(indexer|chunks)'
grep -E 'ERROR SUMMARY|^(--- |FAIL|ok|PASS)' "$OUT/memcheck-keys.log" | head -5; grep -c -- '    --- PASS' "$OUT/memcheck-keys.log"
t 15 racecheck-keys compute-sanitizer --tool racecheck --error-exitcode 9 ./cuda.test -test.v -test.run 'TestCUDACompressStep/indexer/r4/(prompt257|mixed-full|decode)$'
grep -E 'ERROR SUMMARY|^(--- |FAIL|ok|PASS)' "$OUT/racecheck-keys.log" | head -5; grep -c -- '    --- PASS' "$OUT/racecheck-keys.log"
