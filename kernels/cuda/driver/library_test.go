package driver

import (
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/require"
)

// TestDlopenWorksWithoutCgo proves the loading mechanism this package relies
// on: purego's Dlopen/Dlsym/RegisterFunc in a binary built with
// CGO_ENABLED=0 (the build setting is logged).
func TestDlopenWorksWithoutCgo(t *testing.T) {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "CGO_ENABLED" {
				t.Logf("built with CGO_ENABLED=%s", s.Value)
			}
		}
	}
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)
	var getpid func() int32
	sym, err := purego.Dlsym(h, "getpid")
	require.NoError(t, err)
	purego.RegisterFunc(&getpid, sym)
	require.Equal(t, os.Getpid(), int(getpid()))

	_, err = purego.Dlopen("libprologue-no-such-library.so.7", purego.RTLD_NOW)
	require.Error(t, err)
	require.Contains(t, err.Error(), "libprologue-no-such-library.so.7")
}

func TestOpenFirst(t *testing.T) {
	tests := []struct {
		name       string
		candidates []string
		wantPath   string
		wantErr    []string
	}{
		{"first loadable wins", []string{"/nonexistent/libfoo.so", "libc.so.6", "libm.so.6"}, "libc.so.6", nil},
		{"all fail lists every reason", []string{"/nonexistent/liba.so", "libprologue-nope.so"}, "",
			[]string{"none of 2 candidates", "/nonexistent/liba.so", "libprologue-nope.so"}},
		{"no candidates", nil, "", []string{"no candidate paths"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, path, err := openFirst("test library", tc.candidates)
			if tc.wantErr != nil {
				require.Error(t, err)
				for _, s := range tc.wantErr {
					require.Contains(t, err.Error(), s)
				}
				return
			}
			require.NoError(t, err)
			require.NotZero(t, h)
			require.Equal(t, tc.wantPath, path)
		})
	}
}

func TestBindAll(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_LOCAL)
	require.NoError(t, err)

	var getpid func() int32
	var bound string
	require.NoError(t, bindAll(h, "libc.so.6", []binding{
		{fptr: &getpid, names: []string{"prologue_no_such_symbol", "getpid"}, bound: &bound},
	}))
	require.Equal(t, "getpid", bound, "falls back to the second name")
	require.Equal(t, os.Getpid(), int(getpid()))

	var optional func() int32
	bound = "unchanged"
	require.NoError(t, bindAll(h, "libc.so.6", []binding{
		{fptr: &optional, names: []string{"prologue_no_such_symbol"}, optional: true, bound: &bound},
	}))
	require.Nil(t, optional, "a missing optional symbol leaves the function nil")
	require.Empty(t, bound)

	var required func() int32
	err = bindAll(h, "libc.so.6", []binding{{fptr: &required, names: []string{"prologue_sym_v2", "prologue_sym"}}})
	require.EqualError(t, err, "libc.so.6 does not export prologue_sym_v2 or prologue_sym")
}

func TestCStringsAndGoString(t *testing.T) {
	in := []string{"--gpu-architecture=sm_90", "", "-DNAME=a b"}
	bufs, ptrs := cStrings(in)
	require.Len(t, ptrs, len(in))
	for i, s := range in {
		require.Equal(t, byte(0), bufs[i][len(bufs[i])-1], "NUL-terminated")
		require.Equal(t, s, goString(ptrs[i]))
	}
	require.Equal(t, "", goString(nil))
	require.False(t, strings.Contains(goString(ptrs[2]), "\x00"))
}
