#!/usr/bin/env bash
# topk GPU checks: tests (both score kernels), benchmark, memcheck, racecheck; logs to $OUT.
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > $OUT/device.txt 2>&1
echo "== tests" ; timeout 60 ./cuda.test -test.v -test.run 'TestCUDATopK' > $OUT/tests.log 2>&1; echo "rc $?" >> $OUT/tests.log
grep -E -- '^(--- |    --- |FAIL|ok|PASS|panic)|topk_test|Error|error|differ' $OUT/tests.log | grep -v -E 'seed|--- PASS: TestCUDATopKConformance/(mma|dp4a)/' | head -60
tail -2 $OUT/tests.log
echo "== bench"; timeout 55 ./cuda.test -test.run '^$' -test.bench 'CUDATopK' -test.benchtime 3x > $OUT/bench.log 2>&1; echo "rc $?" >> $OUT/bench.log
grep -E 'topk_test.*(a layer|copy)|rc |FAIL|panic' $OUT/bench.log | sort -u | head -40
echo "== memcheck"; timeout 35 compute-sanitizer --tool memcheck --error-exitcode 9 ./cuda.test -test.short -test.run 'TestCUDATopK(Conformance|Graph)$' > $OUT/memcheck.log 2>&1; echo "rc $?" >> $OUT/memcheck.log
grep -E -- 'ERROR SUMMARY|^--- |^(ok|FAIL|PASS)|rc ' $OUT/memcheck.log | head -10
echo "== racecheck"; timeout 30 compute-sanitizer --tool racecheck --error-exitcode 9 ./cuda.test -test.short -test.run 'TestCUDATopKConformance$' > $OUT/racecheck.log 2>&1; echo "rc $?" >> $OUT/racecheck.log
grep -E -- 'ERROR SUMMARY|RACE|hazard|^--- |^(ok|FAIL|PASS)|rc ' $OUT/racecheck.log | sort | uniq -c | head -10
