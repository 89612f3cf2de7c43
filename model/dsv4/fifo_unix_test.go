//go:build unix

package dsv4

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Load refuses a config.json that is a FIFO at once instead of waiting for
// a writer, and a directory too.
func TestLoadRefusesNonRegular(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "config.json")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs here: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := Load(fifo)
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrNotRegular)
		require.ErrorContains(t, err, fifo)
	case <-time.After(20 * time.Second):
		if f, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			f.Close()
		}
		t.Fatal("Load blocked on a FIFO")
	}
	_, err := Load(dir)
	require.ErrorIs(t, err, ErrNotRegular)
}
