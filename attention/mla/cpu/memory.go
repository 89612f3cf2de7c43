package cpu

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
)

var _ mla.MemoryReporter = (*Backend)(nil)

// FreeMemory implements mla.MemoryReporter: the host memory the backend's
// buffers can take, AvailableMemory.
func (b *Backend) FreeMemory() (int64, error) { return AvailableMemory() }

// AvailableMemory is what the host can still give this process: the
// kernel's MemAvailable (/proc/meminfo: free memory plus the page cache
// and reclaimable memory it can drop without swapping), lowered to the
// room left under the process's cgroup memory limit where one is set
// (cgroup v2 memory.max - memory.current, or v1 memory.limit_in_bytes -
// memory.usage_in_bytes), as a container sees it. It fails where
// /proc/meminfo cannot be read (not Linux); callers fall back to a fixed
// figure then.
func AvailableMemory() (int64, error) { return availableMemory(os.ReadFile) }

// availableMemory is AvailableMemory reading files through read.
func availableMemory(read func(path string) ([]byte, error)) (int64, error) {
	raw, err := read("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("cpu: the host's available memory: %w", err)
	}
	avail, err := memAvailable(raw)
	if err != nil {
		return 0, err
	}
	for _, c := range []struct{ limit, usage string }{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},                                 // v2
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}, // v1
	} {
		limit, ok := readBytes(read, c.limit)
		if !ok || limit >= 1<<62 { // "max", or v1's page-rounded MaxInt64: no limit
			continue
		}
		usage, _ := readBytes(read, c.usage)
		avail = min(avail, max(0, limit-usage))
		break
	}
	return avail, nil
}

// memAvailable reads MemAvailable (kB) from /proc/meminfo's contents.
func memAvailable(raw []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemAvailable:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || kb < 0 || kb > math.MaxInt64>>10 {
			break
		}
		return kb << 10, nil
	}
	return 0, errors.New("cpu: the host's available memory: /proc/meminfo has no MemAvailable line in kB")
}

// readBytes reads a cgroup file holding one byte count; false when it is
// missing or holds anything else ("max").
func readBytes(read func(string) ([]byte, error), path string) (int64, bool) {
	raw, err := read(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	return v, err == nil && v >= 0
}
