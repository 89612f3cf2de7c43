package cublaslt

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

func TestCandidatesOverride(t *testing.T) {
	t.Setenv(EnvLibrary, "/opt/x/libcublasLt.so.13")
	require.Equal(t, []string{"/opt/x/libcublasLt.so.13"}, Candidates())
}

func TestCandidatesDefault(t *testing.T) {
	t.Setenv(EnvLibrary, "")
	c := Candidates()
	require.GreaterOrEqual(t, len(c), 3)
	require.Equal(t, []string{"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}, c[:3])
}

// TestOpenMissing: an absent library is a clear error naming every path
// tried and the variable to set.
func TestOpenMissing(t *testing.T) {
	_, err := open([]string{"/nonexistent/libcublasLt.so.13"})
	require.ErrorContains(t, err, "/nonexistent/libcublasLt.so.13")
	require.ErrorContains(t, err, EnvLibrary)
}

// TestOpenWrongLibrary: a library that loads but lacks the symbols is
// refused, naming the first missing one.
func TestOpenWrongLibrary(t *testing.T) {
	libc := ""
	for _, p := range []string{"/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6", "/lib64/libc.so.6"} {
		if _, err := os.Stat(p); err == nil {
			libc = p
			break
		}
	}
	if libc == "" {
		t.Skip("no libc.so.6 at a known path")
	}
	_, err := open([]string{filepath.Clean(libc)})
	require.ErrorContains(t, err, "does not export cublasLtCreate")
}

func TestHeuristicResultSize(t *testing.T) {
	var r heuristicResult
	require.Equal(t, uintptr(heuristicResultSize), unsafe.Sizeof(r))
}
