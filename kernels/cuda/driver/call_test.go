package driver

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCallHandOver drives a hand-over's record through both ways a caller
// learns of its outcome, on the CPU: polling (the owner finishes while the
// caller spins) and parking (the caller gives up polling first and the
// owner wakes it), and checks the record is reusable afterwards.
func TestCallHandOver(t *testing.T) {
	want := errors.New("the function's error")
	for _, tc := range []struct {
		name  string
		spin  bool
		delay time.Duration // before the owner finishes
	}{
		{"finished while polling", true, 0},
		{"finished after the poll gave up", true, 2 * handoffSpin},
		{"parked at once", false, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := callPool.Get().(*call)
			r.f = func() error { return want }
			go func() {
				time.Sleep(tc.delay)
				r.err = r.f()
				r.finish()
			}()
			r.await(tc.spin)
			require.Equal(t, want, r.err)
			if tc.delay > handoffSpin || !tc.spin {
				require.Equal(t, uint32(callParked), r.state.Load(), "the caller parked")
			}
			require.Empty(t, r.wake, "the wake-up was consumed")
		})
	}
}
