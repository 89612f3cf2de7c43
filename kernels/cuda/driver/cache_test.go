package driver

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCacheKey(t *testing.T) {
	type input struct {
		version, program, src string
		options               []string
		headers               []Header
	}
	hs := []Header{{"a.h", "int a;"}, {"b.h", "int b;"}}
	base := input{"13.0", "prologue.cu", "extern \"C\" __global__ void k() {}", []string{"--gpu-architecture=sm_90", "-std=c++17"}, hs}
	key := func(in input) string { return cacheKey(in.version, in.program, in.src, in.options, in.headers) }
	require.Equal(t, key(base), key(base), "deterministic")
	require.Len(t, key(base), 64, "hex SHA-256")

	variants := map[string]input{
		"nvrtc version":     {"13.1", base.program, base.src, base.options, hs},
		"program name":      {base.version, "other.cu", base.src, base.options, hs},
		"source":            {base.version, base.program, base.src + " ", base.options, hs},
		"architecture":      {base.version, base.program, base.src, []string{"--gpu-architecture=sm_100", "-std=c++17"}, hs},
		"option order":      {base.version, base.program, base.src, []string{"-std=c++17", "--gpu-architecture=sm_90"}, hs},
		"extra option":      {base.version, base.program, base.src, append(base.options[:2:2], "--fmad=false"), hs},
		"field boundary":    {base.version, base.program, base.src, []string{"--gpu-architecture=sm_90-std=c++17"}, hs},
		"option into src":   {base.version, base.program, base.src + "--gpu-architecture=sm_90", base.options[1:], hs},
		"no options at all": {base.version, base.program, base.src, nil, hs},
		"header text":       {base.version, base.program, base.src, base.options, []Header{{"a.h", "int a; "}, {"b.h", "int b;"}}},
		"header name":       {base.version, base.program, base.src, base.options, []Header{{"a.h", "int a;"}, {"c.h", "int b;"}}},
		"header order":      {base.version, base.program, base.src, base.options, []Header{hs[1], hs[0]}},
		"no headers":        {base.version, base.program, base.src, base.options, nil},
	}
	seen := map[string]string{key(base): "base"}
	for name, in := range variants {
		k := key(in)
		if prev, dup := seen[k]; dup {
			t.Errorf("variant %q has the same key as %q", name, prev)
		}
		seen[k] = name
	}
}

func TestCacheDirFrom(t *testing.T) {
	userDir := func() (string, error) { return "/home/u/.cache", nil }
	noUserDir := func() (string, error) { return "", errors.New("neither $XDG_CACHE_HOME nor $HOME are defined") }
	tests := []struct {
		name    string
		env     map[string]string
		user    func() (string, error)
		want    string
		wantErr string
	}{
		{"default under the user cache dir", nil, userDir, "/home/u/.cache/prologue/cubin", ""},
		{"override", map[string]string{EnvCacheDir: "/tmp/cubins"}, userDir, "/tmp/cubins", ""},
		{"override needs no home", map[string]string{EnvCacheDir: "/tmp/cubins"}, noUserDir, "/tmp/cubins", ""},
		{"no home and no override", nil, noUserDir, "", "PROLOGUE_CACHE_DIR is unset"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := cacheDirFrom(func(k string) string { return tc.env[k] }, tc.user)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// fakeCubin is a payload that passes the ELF check.
func fakeCubin(body string) []byte { return append(append([]byte{}, elfMagic...), body...) }

func TestDecodeCacheEntry(t *testing.T) {
	good := encodeCacheEntry(fakeCubin("kernel image"))
	flip := func(b []byte, i int) []byte { c := bytes.Clone(b); c[i] ^= 0x40; return c }
	tests := []struct {
		name    string
		entry   []byte
		wantErr string
	}{
		{"intact", good, ""},
		{"empty file", nil, "shorter than the 40-byte header"},
		{"truncated header", good[:20], "shorter than the 40-byte header"},
		{"truncated payload", good[:len(good)-3], "checksum mismatch"},
		{"flipped payload bit", flip(good, len(good)-1), "checksum mismatch"},
		{"flipped checksum bit", flip(good, 10), "checksum mismatch"},
		{"wrong magic", flip(good, 0), "magic"},
		{"not ELF", encodeCacheEntry([]byte("PTX text")), "not an ELF image"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeCacheEntry(tc.entry)
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.Equal(t, fakeCubin("kernel image"), got)
				return
			}
			require.ErrorIs(t, err, errCorruptCacheEntry)
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestCacheEntryFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "cubin")
	path := filepath.Join(dir, "abc.cubin")

	_, err := readCacheEntry(path)
	require.ErrorIs(t, err, os.ErrNotExist, "a missing entry is a plain miss")

	require.NoError(t, writeCacheEntry(path, fakeCubin("one")), "creates missing directories")
	got, err := readCacheEntry(path)
	require.NoError(t, err)
	require.Equal(t, fakeCubin("one"), got)

	require.NoError(t, writeCacheEntry(path, fakeCubin("two")), "replaces an existing entry")
	got, err = readCacheEntry(path)
	require.NoError(t, err)
	require.Equal(t, fakeCubin("two"), got)

	require.NoError(t, os.WriteFile(path, []byte("garbage"), 0o644))
	_, err = readCacheEntry(path)
	require.ErrorIs(t, err, errCorruptCacheEntry)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left behind")
}

// TestCacheEntryConcurrentWriters checks the atomic-rename property: however
// writers interleave, the entry always decodes to one complete payload.
func TestCacheEntryConcurrentWriters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "k.cubin")
	const writers = 8
	payloads := make([][]byte, writers)
	for i := range payloads {
		payloads[i] = fakeCubin(fmt.Sprintf("payload %d %s", i, bytes.Repeat([]byte{byte('a' + i)}, 64<<10)))
	}
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(2)
		go func() { defer wg.Done(); assert.NoError(t, writeCacheEntry(path, payloads[i])) }()
		go func() {
			defer wg.Done()
			if got, err := readCacheEntry(path); err == nil {
				assert.Contains(t, payloads, got)
			} else {
				assert.ErrorIs(t, err, os.ErrNotExist)
			}
		}()
	}
	wg.Wait()
	got, err := readCacheEntry(path)
	require.NoError(t, err)
	require.Contains(t, payloads, got)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary files left behind")
}

// FuzzDecodeCacheEntry: decoding arbitrary bytes never panics, and whatever
// it accepts re-encodes to exactly the input.
func FuzzDecodeCacheEntry(f *testing.F) {
	f.Add(encodeCacheEntry(fakeCubin("seed")))
	f.Add([]byte(cacheMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, entry []byte) {
		payload, err := decodeCacheEntry(entry)
		if err != nil {
			require.ErrorIs(t, err, errCorruptCacheEntry)
			return
		}
		require.Equal(t, entry, encodeCacheEntry(payload))
	})
}

func BenchmarkCacheKey(b *testing.B) {
	src := string(bytes.Repeat([]byte("__device__ float f(float x) { return __fmul_rn(x, x); }\n"), 400))
	opts := []string{"--gpu-architecture=sm_90", "-std=c++17", "-default-device", "--fmad=false", "-DHEAD_DIM=512"}
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		cacheKey("13.0", "prologue.cu", src, opts, nil)
	}
}
