//go:build unix

package weights

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A FIFO in place of a shard, the index or config.json is refused at once
// (open(2) of a FIFO for reading waits for a writer: Load used to hang).
func TestFIFOIsRefused(t *testing.T) {
	cfg := TinyConfig()
	template := write(t, cfg, testSeed(t), SyntheticOptions{LayersPerShard: 2})
	for _, name := range []string{"model-00001-of-00002.safetensors", IndexFile, ConfigFile} {
		t.Run(name, func(t *testing.T) {
			dir := copyCheckpoint(t, template)
			path := filepath.Join(dir, name)
			require.NoError(t, os.Remove(path))
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Skipf("no FIFOs here: %v", err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := Load(dir, nil, LoadOptions{})
				done <- err
			}()
			select {
			case err := <-done:
				require.ErrorIs(t, err, ErrNotRegular)
				require.ErrorContains(t, err, name)
			case <-time.After(20 * time.Second):
				// Unblock the reader so the test binary can exit.
				if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
				}
				t.Fatalf("Load blocked on the FIFO %s", name)
			}
		})
	}
	// A given config needs no config.json, but a FIFO there is still
	// refused rather than opened.
	dir := copyCheckpoint(t, template)
	require.NoError(t, os.Remove(filepath.Join(dir, ConfigFile)))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, ConfigFile), 0o644))
	_, err := Load(dir, &cfg, LoadOptions{})
	require.ErrorIs(t, err, ErrNotRegular)
}
