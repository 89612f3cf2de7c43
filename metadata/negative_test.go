package metadata

import "testing"

// TestAnyNegative: every length from 0 to 19 at both 8-byte alignments,
// with no negative entry and with one at each index (INT32_MIN and -1, the
// entries whose sign bit alone differs from a page), next to entries with
// every other bit set.
func TestAnyNegative(t *testing.T) {
	buf := make([]int32, 24)
	for start := range 2 {
		if start > 0 {
			buf[start-1] = -1 // just before the slice: must not be read
		}
		for n := range 20 {
			v := buf[start : start+n]
			for i := range v {
				v[i] = 0x7FFF_FFFF
			}
			if anyNegative(v) {
				t.Fatalf("start %d len %d: no entry is negative", start, n)
			}
			for i := range v {
				for _, neg := range []int32{-1, -1 << 31} {
					v[i] = neg
					if !anyNegative(v) {
						t.Fatalf("start %d len %d: entry %d = %d not seen", start, n, i, neg)
					}
				}
				v[i] = 0x7FFF_FFFF
			}
			buf[start+n] = -1 // just past the slice: must not be read
			if anyNegative(v) {
				t.Fatalf("start %d len %d: read past the end", start, n)
			}
			buf[start+n] = 0
		}
	}
}
