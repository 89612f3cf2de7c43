//go:build exhaustive || invariants

package numerics

import (
	"testing"
	"time"
)

// TestUE8M0ExponentBitsExhaustive compares UE8M0ExponentBits with UE8M0's
// exponent on every one of the 2^32 float32 bit patterns (all below 1e-4,
// negatives and NaN included, which both floor to 1e-4):
// go test -tags exhaustive -run UE8M0ExponentBitsExhaustive ./numerics
// (-tags invariants runs it too).
func TestUE8M0ExponentBitsExhaustive(t *testing.T) {
	start := time.Now()
	requireUE8M0BitsMatch(t, "every float32", 0, 1<<32)
	t.Logf("2^32 inputs, no differences (%v)", time.Since(start).Round(time.Millisecond))
}
