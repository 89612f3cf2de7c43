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
//
// The parking cases do not time the owner against handoffSpin: on a loaded
// machine the spinning caller can be descheduled past any delay (CI saw it
// once). The owner instead finishes only once the caller has parked, which
// a poll that never gives up would turn into a hang the test's deadline
// reports.
func TestCallHandOver(t *testing.T) {
	want := errors.New("the function's error")
	for _, tc := range []struct {
		name       string
		spin       bool
		afterPark  bool // the owner finishes only once the caller parked
		wantParked bool
	}{
		{"finished while polling", true, false, false},
		{"finished after the poll gave up", true, true, true},
		{"parked at once", false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := callPool.Get().(*call)
			r.f = func() error { return want }
			go func() {
				for tc.afterPark && r.state.Load() != callParked {
					time.Sleep(10 * time.Microsecond)
				}
				r.err = r.f()
				r.finish()
			}()
			r.await(tc.spin)
			require.Equal(t, want, r.err)
			if tc.wantParked {
				require.Equal(t, uint32(callParked), r.state.Load(), "the caller parked")
			}
			require.Empty(t, r.wake, "the wake-up was consumed")
		})
	}
}
