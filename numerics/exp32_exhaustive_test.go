//go:build exhaustive

package numerics

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExp32Exhaustive checks every one of the 2^32 float32 inputs (a few
// minutes over all cores): go test -tags exhaustive -run Exp32Exhaustive ./numerics
func TestExp32Exhaustive(t *testing.T) {
	worst, bits := exp32MaxUlp(0, 1<<32, 1)
	x := math.Float32frombits(bits)
	t.Logf("largest distance %d ulp at %g (%#08x)", worst, x, bits)
	require.LessOrEqualf(t, worst, int64(1), "Exp32(%g) = %g, want %g", x, Exp32(x), exp32Want(x))
}
