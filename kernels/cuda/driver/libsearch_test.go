package driver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLibraryCandidates(t *testing.T) {
	spec := LibrarySpec{Env: "PROLOGUE_X", Sonames: []string{"libx.so.13", "libx.so.12"}, Glob: "libx.so*", Wheels: []string{"xwheel"}}
	env := fakeEnvironment(map[string]string{"CUDA_HOME": "/opt/cuda", "VIRTUAL_ENV": "/venv"},
		"/opt/cuda/lib64/libx.so.12", "/opt/cuda/lib64/libx.so.13.1.0", "/opt/cuda/lib64/liby.so.13",
		"/venv/lib/python3.12", "/venv/lib/python3.12/site-packages",
		"/venv/lib/python3.12/site-packages/nvidia/xwheel/lib/libx.so.12",
		"/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libx.so.13")
	require.Equal(t, []string{"libx.so.13", "libx.so.12",
		"/opt/cuda/lib64/libx.so.13.1.0", "/opt/cuda/lib64/libx.so.12",
		"/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libx.so.13",
		"/venv/lib/python3.12/site-packages/nvidia/xwheel/lib/libx.so.12"}, libraryCandidates(env, spec))

	env = fakeEnvironment(map[string]string{"PROLOGUE_X": "/my/libx.so", "CUDA_HOME": "/opt/cuda"}, "/opt/cuda/lib64/libx.so.13")
	require.Equal(t, []string{"/my/libx.so"}, libraryCandidates(env, spec), "the override is the only candidate")
}

func TestOpenLibraryMissing(t *testing.T) {
	_, _, err := OpenLibrary("libx (set PROLOGUE_X)", []string{"/nonexistent/libx.so.13"})
	require.ErrorContains(t, err, "/nonexistent/libx.so.13")
	require.ErrorContains(t, err, "set PROLOGUE_X")
}
