#!/usr/bin/env bash
# tscore (issue 24), round 3, at most ~95 s (END): topk_score_mma4x, the
# default score kernel since d1f4c98, in the engine. Run from the repository
# root: bash .gpu-tscore/run.sh. Log: $OUT/tscore.log, the raw output
# $OUT/streams.log; a summary on stdout; exit 1 when a test failed or did not
# finish.
# The binary: tests.test of main at commit.txt (the defaults: mma4x +
# topk_select5).
#   0. TestChainCUDAIndexerStreams/tiny/: the tiny model's chain with its
#      ratio-4 layer (index_topk 4, so that every row past 16 tokens is
#      scored), prefill then MTP decode with rejected drafts, through CUDA
#      graphs and launch by launch, on 8 backend variants (query path on the
#      main and third stream, no cuBLASLt, no PDL, no wgmma, cuBLASLt split-K
#      choices); each iteration verified as cmd/decode --verify does, the
#      indexer's top-k indices element for element against the CPU
#      reference engine. The first subtest compiles every module cold.
set -u
D=.gpu-tscore
OUT=${OUT:-/tmp/tscore-out}
mkdir -p "$OUT"
LOG=$OUT/tscore.log
: >"$LOG"
END=${END:-95}
W=$(mktemp -d /tmp/tsc.XXXXXX)
export PROLOGUE_CACHE_DIR=$W/cache
mkdir -p "$PROLOGUE_CACHE_DIR"
T=$W/tests.test
gunzip -c $D/tests.test.gz >"$T" && chmod +x "$T"
say() { echo "$*" | tee -a "$LOG"; }
step() { say "=== [${SECONDS}s] $*"; }
status=0
say "tscore round 3: commit $(cat $D/commit.txt 2>/dev/null || echo '?'), $(date -u +%FT%TZ)"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm --format=csv,noheader 2>&1 | head -1 | tee -a "$LOG"

step "0. TestChainCUDAIndexerStreams/tiny/ (the defaults; --verify's checks, top-k indices included)"
t=$((END - SECONDS - 3))
timeout "$t" bash -c "env -C tests '$T' -test.v -test.count=1 -test.run 'TestChainCUDAIndexerStreams\$/^tiny\$/'" >"$W/streams.log" 2>&1
rc=$?
np=$(grep -cE -- '--- PASS: TestChainCUDAIndexerStreams/tiny/' "$W/streams.log")
nf=$(grep -cE -- '--- FAIL' "$W/streams.log")
say "rc $rc (timeout ${t}s: 124); $np subtests PASS (16 if complete), $nf FAIL lines"
grep -E -- '^\s*--- (PASS|FAIL|SKIP)|^(ok|FAIL|PASS)' "$W/streams.log" | tee -a "$LOG"
grep -E -B2 -A10 -- 'Error Trace|panic' "$W/streams.log" | cut -c1-300 | head -40 | tee -a "$LOG"
if [ $rc -ne 0 ] || [ "$np" -lt 16 ] || [ "$nf" -gt 0 ]; then status=1; fi
cp "$W/streams.log" "$OUT/streams.log"

step "done: status $status (0: every subtest passed)"
echo "--- summary"
grep -E '^rc|--- (PASS|FAIL)|^=== ' "$LOG" | cut -c1-200
rm -rf "$W"
exit $status
