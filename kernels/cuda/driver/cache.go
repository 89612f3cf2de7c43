package driver

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Cache entries are: 8-byte magic, SHA-256 of the payload, the CUBIN. The
// checksum catches truncated or bit-rotted files, which are then recompiled.
const cacheMagic = "PLGCUBN1"

const cacheHeaderLen = len(cacheMagic) + sha256.Size

// cacheKeyVersion changes whenever the key's inputs or the entry format
// change, so stale entries are never read.
const cacheKeyVersion = "prologue cubin cache v2"

// cacheKey hashes everything that determines the CUBIN: the NVRTC version,
// the program name (it appears in diagnostics and debug info), the source,
// the complete option list (which includes the architecture) and the
// in-memory headers, names and texts, in order. Each field is
// length-prefixed so no two different inputs can concatenate alike.
func cacheKey(nvrtcVersion, program, src string, options []string, headers []Header) string {
	h := sha256.New()
	field := func(s string) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field(cacheKeyVersion)
	field(nvrtcVersion)
	field(program)
	field(src)
	field(fmt.Sprint(len(options)))
	for _, o := range options {
		field(o)
	}
	field(fmt.Sprint(len(headers)))
	for _, hd := range headers {
		field(hd.Name)
		field(hd.Source)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// cacheDirFrom resolves the cache directory: $PROLOGUE_CACHE_DIR when set,
// else <user cache dir>/prologue/cubin.
func cacheDirFrom(getenv func(string) string, userCacheDir func() (string, error)) (string, error) {
	if d := getenv(EnvCacheDir); d != "" {
		return d, nil
	}
	base, err := userCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cubin cache directory: %s is unset and the user cache directory is unknown: %w", EnvCacheDir, err)
	}
	return filepath.Join(base, "prologue", "cubin"), nil
}

// CacheDir is where compiled CUBINs are kept between runs.
func CacheDir() (string, error) { return cacheDirFrom(os.Getenv, os.UserCacheDir) }

func encodeCacheEntry(cubin []byte) []byte {
	sum := sha256.Sum256(cubin)
	out := make([]byte, 0, cacheHeaderLen+len(cubin))
	out = append(out, cacheMagic...)
	out = append(out, sum[:]...)
	return append(out, cubin...)
}

// errCorruptCacheEntry marks an entry that exists but cannot be trusted.
var errCorruptCacheEntry = errors.New("corrupt cubin cache entry")

// decodeCacheEntry returns the CUBIN inside an entry, or an error wrapping
// errCorruptCacheEntry that says what is wrong with it.
func decodeCacheEntry(b []byte) ([]byte, error) {
	if len(b) < cacheHeaderLen {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the %d-byte header", errCorruptCacheEntry, len(b), cacheHeaderLen)
	}
	if string(b[:len(cacheMagic)]) != cacheMagic {
		return nil, fmt.Errorf("%w: magic %q, want %q", errCorruptCacheEntry, b[:len(cacheMagic)], cacheMagic)
	}
	payload := b[cacheHeaderLen:]
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], b[len(cacheMagic):cacheHeaderLen]) {
		return nil, fmt.Errorf("%w: checksum mismatch over %d payload bytes", errCorruptCacheEntry, len(payload))
	}
	if !bytes.HasPrefix(payload, elfMagic) {
		return nil, fmt.Errorf("%w: payload is not an ELF image", errCorruptCacheEntry)
	}
	return payload, nil
}

// readCacheEntry loads and verifies the entry at path. A missing file gives
// an error satisfying errors.Is(err, os.ErrNotExist).
func readCacheEntry(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decodeCacheEntry(b)
}

// writeCacheEntry stores cubin at path atomically: a temporary file in the
// same directory renamed over the target, so a concurrent reader sees either
// the old entry, no entry, or the complete new one.
func writeCacheEntry(path string, cubin []byte) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(encodeCacheEntry(cubin)); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
