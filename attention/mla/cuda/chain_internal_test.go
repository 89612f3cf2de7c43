package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
)

// norm_quant's launch shape: a decode batch spread one warp a block over
// the SMs, a prefill batch in full blocks, and every block's shared memory
// within what the launch may ask (48 KiB, or the attribute loadChain sets
// for the one-warp block of the widest row).
func TestNormQuantLaunchShape(t *testing.T) {
	const sms = 132
	for _, c := range []struct{ rows, k, warps int }{
		{1, 1024, 1},
		{128, 1024, 1},    // V4-Flash decode b=32 MTP 3
		{128, 1536, 1},    // V4-Pro
		{264, 1024, 2},    // two rows an SM
		{4096, 1024, 8},   // prefill: ChainWarps
		{4096, 1536, 8},   // 8 x 3328 + 6144 bytes
		{4096, 8192, 1},   // the widest row: one warp a block
		{100000, 4096, 3}, // 3 x 8448 + 16384 within 48 KiB
	} {
		w := normQuantBlockWarps(c.rows, c.k, sms)
		require.Equal(t, c.warps, w, "rows %d k %d", c.rows, c.k)
		if w > 1 {
			require.LessOrEqual(t, normQuantShared(w, c.k), 48<<10, "rows %d k %d", c.rows, c.k)
		}
		require.LessOrEqual(t, normQuantShared(w, c.k), normQuantShared(1, mla.MaxNormQuantK), "rows %d k %d", c.rows, c.k)
	}
}
