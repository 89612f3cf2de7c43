#!/bin/bash
# iqp round 2 (issue 23): the default switch to indexer_query_tok from 4096 token rows (cudatune SM90
# IndexerQueryTokMinRows 4096; round 1: tok 34.22 / 129.42 us against stream 39.65 / 141.72 at 4K / 16K, tok's
# conformance 130 subtests PASS) checked in the engine and timed in the layer.
# Steps (each with a timeout; the whole within 147 s):
#  chain  tests.test TestChainCUDAIndexerStreams for the tiny model and V4-Flash decode (cmd/decode's own run: its
#         embedded chain trace, --verify byte for byte) on the default backend (cuda-istream-aux: tok from 4096 rows)
#         and cuda-istream-aux-tok (indexer_query_tok at every size).
#  ab-N   cmd/bench --indexer-only --indexer-prologue-only: (a) the ratio-4 layer and (b) with the indexer's prologue,
#         each captured 5 times in turn (medians: graphs of the same layers differ by tens of us at prefill), then
#         (b-q) without its query step and the query step alone; V4-Flash 4K/16K twice each, V4-Pro 4K (3 captures);
#         "tok" = the binary's defaults (tok from 4096 rows), "stream" = --variant itok=16777216 (the previous default).
# Log: $OUT/iqp.log; each step's output $OUT/<step>.txt (+ ab-*.json).
set -u
OUT=${OUT:-/tmp/iqp-out}
mkdir -p "$OUT"
LOG=$OUT/iqp.log
D=$(cd "$(dirname "$0")" && pwd)
R=$(cd "$D/.." && pwd)
B=/tmp/iqp
T0=$(date +%s)
END=$((T0 + 147))
fail=0
: > "$LOG"
echo "# iqp round 2: binaries of $(cat "$D/COMMIT" 2>/dev/null), $(date -u +%FT%TZ)" | tee -a "$LOG"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | tee -a "$LOG"
mkdir -p $B && for f in tests.test bench; do gunzip -c "$D/$f.gz" > $B/$f && chmod +x $B/$f || { echo "gunzip $f failed"; exit 1; }; done
step() { # name timeout dir cmd...
  local name=$1 to=$2 dir=$3; shift 3
  local left=$((END - $(date +%s)))
  if [ "$left" -lt 5 ]; then echo "=== $name skipped (no time left)" | tee -a "$LOG"; return 1; fi
  [ "$to" -gt "$left" ] && to=$left
  local s=$(date +%s)
  echo "=== $name: $*" >> "$LOG"
  (cd "$dir" && timeout "$to" "$@") > "$OUT/$name.txt" 2>&1
  local rc=$?
  cat "$OUT/$name.txt" >> "$LOG"
  echo "=== $name rc=$rc ($(( $(date +%s) - s )) s of $to)" | tee -a "$LOG"
  return $rc
}
# 1. the engine with the new default and with tok everywhere (first kernel-touching step: cold compile).
step chain 75 "$R/tests" $B/tests.test -test.v -test.count=1 -test.run 'TestChainCUDAIndexerStreams/(tiny|flash-decode)/cuda-istream-aux(-tok)?/' || fail=1
grep -E -- '--- (PASS|FAIL|SKIP): TestChainCUDAIndexerStreams' "$OUT/chain.txt" | sed 's/^ *//'
echo "chain subtests: $(grep -c -- '--- PASS: TestChainCUDAIndexerStreams/' "$OUT/chain.txt") pass, $(grep -c -- '--- FAIL' "$OUT/chain.txt") fail"
grep -m4 -B2 -A8 -- '--- FAIL' "$OUT/chain.txt" | cut -c1-300 | head -30
for want in tiny/cuda-istream-aux-tok/graphs tiny/cuda-istream-aux-tok/eager flash-decode/cuda-istream-aux-tok/graphs flash-decode/cuda-istream-aux/graphs; do
  grep -q -- "--- PASS: TestChainCUDAIndexerStreams/$want " "$OUT/chain.txt" && echo "chain $want PASS" || { echo "chain $want did not pass"; fail=1; }
done
# 2. the layer, alternating the new default (tok) and the previous one (stream).
ab() { # name timeout models ctx reps variant
  step ab-$1 $2 "$R" $B/bench --indexer-only --indexer-no-topk --indexer-prologue-only --indexer-prologue-reps $5 --models $3 --graph-reps 10 --indexer-batches none --indexer-ctx-tokens $4 --variant "$6" --out "$OUT/ab-$1.json" || fail=1
  grep -E 'medians of|query step alone:|but the query step:' "$OUT/ab-$1.txt" | sed -E "s/^  indexer /ab-$1 /; s/ context=0//; s/ \[[0-9.]+ s\]$//"
}
ab tok1 16 flash 4096,16384 5 ""
ab stream1 16 flash 4096,16384 5 "itok=16777216"
ab pro-tok 12 pro 4096 3 ""
ab pro-stream 12 pro 4096 3 "itok=16777216"
ab tok2 16 flash 4096,16384 5 ""
ab stream2 16 flash 4096,16384 5 "itok=16777216"
echo "=== done in $(( $(date +%s) - T0 )) s, fail=$fail" | tee -a "$LOG"
exit $fail
