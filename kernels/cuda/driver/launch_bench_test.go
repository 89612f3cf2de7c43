package driver

import (
	"testing"

	"github.com/dsv4mla/prologue/internal/fakecuda"
)

// The host cost of the calls an eager iteration makes. Without a GPU they
// run against internal/fakecuda's libcuda (whose launch copies the
// arguments and runs a trivial host kernel), so they time this package's
// own work: the hand-over to the owner thread, argument packing, the
// launch configuration and the purego call. Run them alone (-run '^$'):
// the fake is selected before the first driver call of the process.
// PROLOGUE_LIBCUDA set to a real libcuda times the real driver instead.

func benchContext(b *testing.B) (*Context, *Function, DevicePtr, *Stream) {
	b.Helper()
	if err := fakecuda.Use(); err != nil {
		b.Skip(err.Error())
	}
	c := openTestContext(b)
	m := loadTestModule(b, c)
	return c, mustFunction(b, m, "add_one"), allocT(b, c, 4096), newStreamT(b, c)
}

// BenchmarkDo is one empty hand-over to the owner thread and back.
func BenchmarkDo(b *testing.B) {
	c, _, _, _ := benchContext(b)
	f := func() error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Do(f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLaunchPDLOnOwner is a launch issued on the owner thread (inside
// one Do, as a batched layer issues its launches).
func BenchmarkLaunchPDLOnOwner(b *testing.B) {
	c, fn, p, s := benchContext(b)
	b.ReportAllocs()
	err := c.Do(func() error {
		for b.Loop() {
			if err := c.LaunchPDL(fn, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, p, uint32(32)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLaunchPDLViaDo is a launch from another goroutine: one
// hand-over each.
func BenchmarkLaunchPDLViaDo(b *testing.B) {
	c, fn, p, s := benchContext(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.LaunchPDL(fn, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, p, uint32(32)); err != nil {
			b.Fatal(err)
		}
	}
}
