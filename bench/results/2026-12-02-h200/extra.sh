#!/usr/bin/env bash
# The project's GPU checks of the kernels changed since 202109c, from one cuda.test
# built at f6961b6: the indexer query (both formats), the top-k score kernels (mma,
# dp4a, mma4) with the changed select, their benchmark, the GEMM chain replay (current
# and the 508f76b rewrite), and the engine end to end under --verify. Run by run.sh
# (EXTRA=.gpu-final/extra.sh EXTRA_S=80 END_S=210) between ours and the engines' timing.
D=.gpu-final; C=$D/cuda.test
s() { echo "=== [$SECONDS s] $*"; }
echo "commit $(cat $D/commit.txt)"
s indexer
timeout 10 $C -test.v -test.count=1 -test.run '^(TestCUDAIndexerQuery|TestCUDAIndexerRotation)$' > $OUT/final-indexer.log 2>&1; echo "rc $?"
for f in mxfp4 fp8; do echo "  $f: $(grep -cE -- "--- PASS: TestCUDAIndexerQuery/.*/$f " $OUT/final-indexer.log) PASS, $(grep -cE -- "--- FAIL: TestCUDAIndexerQuery/.*/$f " $OUT/final-indexer.log) FAIL"; done
grep -E '^--- (PASS|FAIL|SKIP)' $OUT/final-indexer.log; grep -E -A4 -- '--- FAIL' $OUT/final-indexer.log | head -12
s topk tests
timeout 22 $C -test.v -test.short -test.run 'TestCUDATopK(Conformance|Graph|Large)$' > $OUT/final-topk.log 2>&1; echo "rc $?"
grep -E -- '^--- |^    --- (PASS|FAIL): TestCUDATopK(Conformance|Graph)/(mma|dp4a|mma4) ' $OUT/final-topk.log | head -12
grep -E -- '--- FAIL|Error:|differ|panic|score kernel' $OUT/final-topk.log | head -8
s topk bench
timeout 14 $C -test.run '^$' -test.bench '^BenchmarkCUDATopK$/^decode-b32-mtp3(-narrow)?$/^ctx=(8|64)K$/^topk=512$/^(mma|mma4)$' -test.benchtime 3x > $OUT/final-topk-bench.log 2>&1; echo "rc $?"
grep -E 'us a layer|copy:' $OUT/final-topk-bench.log | sed -E 's/^.*_test.go:[0-9]+: //' | sort -u | head -12
s gemm chain replay
timeout 12 $C -test.run 'TestCUDAGEMMChainReplay' -test.v -test.timeout 11s -gemm.rewrite > $OUT/final-gemm.log 2>&1; echo "rc $?"
grep -E -- '^\s*--- (PASS|FAIL|SKIP)|differ|panic' $OUT/final-gemm.log | head -16
s decode verify
timeout 26 $D/decode --backend cuda --verify --summary-only --input hidden > $OUT/final-decode.log 2>&1; echo "rc $?"
grep -E 'replayed|engine:|verify:|differ|rror' $OUT/final-decode.log | head -6
s done
