package bytediff

import "bytes"

// First is the first index where a and b differ (the shorter one's length
// when one is a prefix of the other), or -1 when they are equal.
func First(a, b []byte) int {
	if bytes.Equal(a, b) { // the usual case, without a loop per byte
		return -1
	}
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
