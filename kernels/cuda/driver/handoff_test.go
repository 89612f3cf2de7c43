package driver

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var handoff = flag.Bool("handoff", false, "TestHandoffLatency: print the host cost of Do and of launches")

// TestHandoffLatency prints the distribution of the host time of a
// call handed to the owner thread (an empty Do, a launch through Do, with
// and without PDL) and of a launch issued on the owner thread itself, on
// an idle GPU and behind a long-running kernel. It finds where an eager
// iteration's host time goes (run with -handoff; it asserts nothing about
// speed).
func TestHandoffLatency(t *testing.T) {
	if !*handoff {
		t.Skip("run with -handoff")
	}
	c := openTestContext(t)
	m := loadTestModule(t, c)
	addOne := mustFunction(t, m, "add_one")
	lcg := mustFunction(t, m, "lcg_rounds")
	p := allocT(t, c, 4<<20)
	s := newStreamT(t, c)
	const calls = 2000
	report := func(name string, ds []time.Duration) {
		slices.Sort(ds)
		q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))] }
		fmt.Printf("%-34s p50 %8v p90 %8v p99 %8v max %8v\n", name, q(0.5), q(0.9), q(0.99), ds[len(ds)-1])
	}
	measure := func(name string, busy bool, f func() error) {
		ds := make([]time.Duration, 0, calls)
		for i := range calls {
			if busy && i%200 == 0 {
				require.NoError(t, c.Synchronize())
				// About a millisecond of GPU work queued ahead.
				require.NoError(t, c.Launch(lcg, Dim3{1024, 1, 1}, Dim3{256, 1, 1}, 0, s, p, uint32(1<<18), uint32(2000)))
			}
			t0 := time.Now()
			require.NoError(t, f())
			ds = append(ds, time.Since(t0))
		}
		require.NoError(t, c.Synchronize())
		report(name, ds)
	}
	for _, busy := range []bool{false, true} {
		tag := "idle"
		if busy {
			tag = "busy"
		}
		measure("Do(empty) "+tag, busy, func() error { return c.Do(func() error { return nil }) })
		measure("Launch via Do "+tag, busy, func() error {
			return c.Launch(addOne, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, p, uint32(32))
		})
		measure("LaunchPDL via Do "+tag, busy, func() error {
			return c.LaunchPDL(addOne, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, p, uint32(32))
		})
		ds := make([]time.Duration, 0, calls)
		require.NoError(t, c.Do(func() error {
			for i := range calls {
				if busy && i%200 == 0 {
					if err := c.Launch(lcg, Dim3{1024, 1, 1}, Dim3{256, 1, 1}, 0, s, p, uint32(1<<18), uint32(2000)); err != nil {
						return err
					}
				}
				t0 := time.Now()
				if err := c.LaunchPDL(addOne, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, p, uint32(32)); err != nil {
					return err
				}
				ds = append(ds, time.Since(t0))
			}
			return nil
		}))
		require.NoError(t, c.Synchronize())
		report("LaunchPDL on the owner "+tag, ds)
	}
}
