# One line a shape of cmd/bench's indexer report: (a), (b) (the engine's way), (b1), (b3), the query step alone.
/^indexer flash/ {
  gsub(/ +/, " "); s = $0; out = ""
  if (match(s, /(generation|context) b=[0-9]+ mtp=[0-9]+ tokens=[0-9]+/)) out = substr(s, RSTART, RLENGTH)
  if (match(s, /\(a\) ratio-4 layer [0-9.]+/)) out = out " | " substr(s, RSTART, RLENGTH)
  if (match(s, /\(b\) with the indexer.s prologue [0-9.]+ us\/layer \( ?[-+0-9.]+ us, [-+0-9.]+%/)) out = out " | " substr(s, RSTART, RLENGTH)
  if (match(s, /\(b1\) query path on the main stream [0-9.]+ \( ?[-+0-9.]+%\)/)) out = out " | " substr(s, RSTART, RLENGTH)
  if (match(s, /\(b3\) on a third stream [0-9.]+ \( ?[-+0-9.]+%\)/)) out = out " | " substr(s, RSTART, RLENGTH)
  if (match(s, /query step [0-9.]+/)) out = out " | " substr(s, RSTART, RLENGTH)
  print pre out
}
