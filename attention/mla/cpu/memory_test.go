package cpu

import (
	"io/fs"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAvailableMemory(t *testing.T) {
	const meminfo = "MemTotal:       24683548 kB\nMemFree:         1000000 kB\nMemAvailable:   23874748 kB\n"
	avail := int64(23874748) << 10
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
		err   string
	}{
		{"meminfo alone", map[string]string{"/proc/meminfo": meminfo}, avail, ""},
		{"cgroup v2 limit", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory.max": "8589934592\n", "/sys/fs/cgroup/memory.current": "1073741824\n"}, 7 << 30, ""},
		{"cgroup v2 without a limit", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/memory.current": "1073741824\n"}, avail, ""},
		{"cgroup v1 limit", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "4294967296\n", "/sys/fs/cgroup/memory/memory.usage_in_bytes": "1073741824\n"}, 3 << 30, ""},
		{"cgroup v1 without a limit", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n", "/sys/fs/cgroup/memory/memory.usage_in_bytes": "3198259200\n"}, avail, ""},
		{"a limit above what the host has", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory.max": "1099511627776\n", "/sys/fs/cgroup/memory.current": "0\n"}, avail, ""},
		{"usage past the limit", map[string]string{"/proc/meminfo": meminfo,
			"/sys/fs/cgroup/memory.max": "1073741824\n", "/sys/fs/cgroup/memory.current": "2147483648\n"}, 0, ""},
		{"no meminfo", map[string]string{}, 0, "file does not exist"},
		{"no MemAvailable", map[string]string{"/proc/meminfo": "MemTotal: 1 kB\n"}, 0, "no MemAvailable line"},
		{"MemAvailable not in kB", map[string]string{"/proc/meminfo": "MemAvailable: 12 MB\n"}, 0, "no MemAvailable line"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := availableMemory(func(p string) ([]byte, error) {
				if s, ok := tc.files[p]; ok {
					return []byte(s), nil
				}
				return nil, fs.ErrNotExist
			})
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestAvailableMemoryHere: on Linux the host's figure is positive.
func TestAvailableMemoryHere(t *testing.T) {
	n, err := New(1).FreeMemory()
	if err != nil {
		t.Skipf("no /proc/meminfo here: %v", err)
	}
	require.Positive(t, n)
	t.Logf("available: %d bytes", n)
}
