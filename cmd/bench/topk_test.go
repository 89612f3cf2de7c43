package main

import (
	"bytes"
	"errors"
	"fmt"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTopKLine(t *testing.T) {
	decode64K := topkReading{Batch: "decode-b32-mtp3", Context: 64 << 10, TopK: 512, Kernel: "mma", Us: 737.3, ScoreUs: 700.3,
		SelectUs: 25.6, CacheBytes: 35572568, CacheFloorUs: 19.69, Int8FloorUs: 17.32, Pairs: 2092462}
	mma4 := decode64K
	mma4.Kernel, mma4.Us, mma4.ScoreUs, mma4.SelectUs, mma4.CacheFloorUs = "mma4", 287.2, 212.2, 46.1, 10.18
	for _, c := range []struct {
		name, line string
		want       topkReading
		ok         bool
		err        bool
	}{
		{"go test prefix", "    topk_test.go:261: decode-b32-mtp3/ctx=64K/topk=512 mma: 737.3 us a layer (score alone 700.3, select alone 25.6); floors: cache 35572568 bytes 19.69 us, int8 17.32 us (2092462 row-entry pairs)", decode64K, true, false},
		{"no prefix", "decode-b32-mtp3/ctx=64K/topk=512 mma4: 287.2 us a layer (score alone 212.2, select alone 46.1); floors: cache 35572568 bytes 10.18 us, int8 17.32 us (2092462 row-entry pairs)", mma4, true, false},
		{"1M as 1024K", "    topk_test.go:286: decode-b32-mtp3/ctx=1024K/topk=1024 dp4a: 11617.7 us a layer (score alone 11004.4, select alone 498.4); floors: cache 570344492 bytes 315.74 us, int8 277.76 us (33549631 row-entry pairs)",
			topkReading{Batch: "decode-b32-mtp3", Context: 1 << 20, TopK: 1024, Kernel: "dp4a", Us: 11617.7, ScoreUs: 11004.4, SelectUs: 498.4,
				CacheBytes: 570344492, CacheFloorUs: 315.74, Int8FloorUs: 277.76, Pairs: 33549631}, true, false},
		{"prefill, no context", "prefill=16K/topk=512 mma: 9667.0 us a layer (score alone 9096.3, select alone 514.5); floors: cache 278528 bytes 0.15 us, int8 277.76 us (33550336 row-entry pairs)",
			topkReading{Batch: "prefill=16K", TopK: 512, Kernel: "mma", Us: 9667.0, ScoreUs: 9096.3, SelectUs: 514.5,
				CacheBytes: 278528, CacheFloorUs: 0.15, Int8FloorUs: 277.76, Pairs: 33550336}, true, false},
		// The short form the device scripts of 2026-12-02-h200-topkperf
		// printed (call2.log, final.log; 2026-12-02-h200-e/lead.log), with
		// a select kernel after the score kernel's name.
		{"short form, score+select", "decode-b32-mtp3/ctx=8K/topk=512 mma4q+select2: 40.8 us a layer (score alone 31.9, select alone 8.9); floors cache 1.19, int8 2.13",
			topkReading{Batch: "decode-b32-mtp3", Context: 8 << 10, TopK: 512, Kernel: "mma4q+select2", Us: 40.8, ScoreUs: 31.9, SelectUs: 8.9,
				CacheFloorUs: 1.19, Int8FloorUs: 2.13}, true, false},
		{"short form, narrow, 1M", "decode-b32-mtp3-narrow/ctx=1024K/topk=512 mma4+radix: 2785.3 us a layer (score alone 2225.0, select alone 493.5); floors cache 158.77, int8 277.76",
			topkReading{Batch: "decode-b32-mtp3-narrow", Context: 1 << 20, TopK: 512, Kernel: "mma4+radix", Us: 2785.3, ScoreUs: 2225.0, SelectUs: 493.5,
				CacheFloorUs: 158.77, Int8FloorUs: 277.76}, true, false},
		{"full form, score+select", "    topk_test.go:297: decode-b32-mtp3/ctx=64K/topk=512 mma4q+select4: 180.5 us a layer (score alone 158.1, select alone 12.3); floors: cache 35572568 bytes 9.90 us, int8 17.32 us (2092462 row-entry pairs)",
			topkReading{Batch: "decode-b32-mtp3", Context: 64 << 10, TopK: 512, Kernel: "mma4q+select4", Us: 180.5, ScoreUs: 158.1, SelectUs: 12.3,
				CacheBytes: 35572568, CacheFloorUs: 9.90, Int8FloorUs: 17.32, Pairs: 2092462}, true, false},
		{"short form cut short", "decode-b32-mtp3/ctx=8K/topk=512 mma4q: 41.5 us a layer (score alone 31.4, select alone 11.8); floors cache 1.22", topkReading{}, false, true},
		{"two floor forms mixed", "decode-b32-mtp3/ctx=8K/topk=512 mma4q: 41.5 us a layer (score alone 31.4, select alone 11.8); floors cache 1.22, int8 2.13 us (100 row-entry pairs)", topkReading{}, false, true},
		{"quoted by a script", "ncu rc 0 (timeout 35s); decode-b32-mtp3/ctx=64K/topk=512 mma4: 300.1 us a layer (score alone 221.3, select alone 109.7); floors: cache 35572568 bytes 10.07 us, int8 17.32 us (2092462 row-entry pairs)", topkReading{}, false, false},
		{"quoted, malformed", "ncu rc 0 (timeout 35s); decode-b32-mtp3/ctx=64K/topk=512 mma4: 300.1 us a layer (score alone 221.3, select alone", topkReading{}, false, true},
		{"another line", "BenchmarkCUDATopK/decode-b32-mtp3/ctx=8K/topk=512/mma-16  3  1084677 ns/op  96.46 us/layer", topkReading{}, false, false},
		{"empty", "", topkReading{}, false, false},
		{"cut short", "decode-b32-mtp3/ctx=64K/topk=512 mma: 737.3 us a layer (score alone 700.3, select alone 25.6); floors: cache 35572568 bytes", topkReading{}, false, true},
		{"bad number", "decode-b32-mtp3/ctx=64K/topk=512 mma: 7.3.7 us a layer (score alone 700.3, select alone 25.6); floors: cache 35572568 bytes 19.69 us, int8 17.32 us (2092462 row-entry pairs)", topkReading{}, false, true},
		{"bad context", "decode-b32-mtp3/ctx=64G/topk=512 mma: 737.3 us a layer (score alone 700.3, select alone 25.6); floors: cache 35572568 bytes 19.69 us, int8 17.32 us (2092462 row-entry pairs)", topkReading{}, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok, err := parseTopKLine(c.line)
			if c.err {
				assert.ErrorIs(t, err, errTopKLine)
				assert.False(t, ok)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.ok, ok)
			if ok {
				assert.Equal(t, c.want, got)
			}
		})
	}
}

// TestTopKResultLogs reads every log in bench/results that has the
// benchmark's lines: each such line parses (every form the device calls
// wrote), and the readings are the ones the folders' READMEs quote.
func TestTopKResultLogs(t *testing.T) {
	type want struct {
		batch     string
		ctx, topk int
		kernel    string
		us        float64
		sel       float64
	}
	for _, c := range []struct {
		log           string
		lines, quoted int // readings in the log, and quoted ones left out
		has           []want
	}{
		{"2026-12-01-h200-topk/bench.log", 28, 0, []want{{"decode-b32-mtp3", 64 << 10, 512, "mma", 736.9, 25.3}, {"prefill=16K", 0, 1024, "mma", 9150.3, 478.3}}},
		{"2026-12-02-h200/extra.log", 12, 0, []want{{"decode-b32-mtp3", 64 << 10, 512, "mma4", 287.2, 46.1}}},
		{"2026-12-02-h200-topkperf/call2.log", 252, 12, []want{{"decode-b32-mtp3", 8 << 10, 512, "mma4q+select2", 40.8, 8.9},
			{"decode-b32-mtp3", 1 << 20, 512, "mma4q+select2", 2995.1, 697.5}}},
		{"2026-12-02-h200-topkperf/final.log", 192, 0, []want{{"decode-b32-mtp3", 64 << 10, 512, "mma4q", 191.1, 21.5},
			{"decode-b32-mtp3", 1 << 20, 512, "mma4+radix", 3670.8, 492.9}, {"decode-b32-mtp3-narrow", 64 << 10, 512, "mma4q", 141.6, 21.2}}},
		{"2026-12-02-h200-e/lead.log", 18, 0, []want{{"decode-b32-mtp3", 1 << 20, 512, "mma4q", 2453.6, 155.7}}},
		{"2026-12-02-h200-g/topk/bench.log", 64, 0, []want{{"decode-b32-mtp3", 8 << 10, 512, "mma4q+select4", 37.3, 7.4},
			{"decode-b32-mtp3-narrow", 1 << 20, 512, "mma4q+select6", 1948.1, 498.2}}},
		{"2026-12-02-h200-h/topk/bench.log", 48, 0, []want{{"decode-b32-mtp3", 64 << 10, 512, "mma4u", 174.3, 21.2},
			{"prefill=16K", 0, 512, "mma4q", 3014.8, 759.7}}},
		{"2026-12-02-h200-i/topkp/call1/bench.log", 30, 0, []want{{"decode-b32-mtp3", 8 << 10, 512, "mma4u+select5", 36.0, 7.1},
			{"decode-b32-mtp3", 64 << 10, 512, "mma4u+select5", 170.1, 16.9}, {"prefill=16K", 0, 512, "mma4u+select4n", 2521.7, 295.9}}},
		{"2026-12-02-h200-i/topkp/call2/bench.log", 60, 0, []want{{"decode-b32-mtp3", 128 << 10, 512, "mma4u", 325.0, 28.3},
			{"chunk=1K-at-3K", 0, 512, "mma4u+select4", 122.2, 40.8}}},
		{"2026-12-02-h200-j/tscore/call1/bench.log", 92, 0, []want{{"decode-b32-mtp3", 8 << 10, 512, "mma4x", 29.9, 7.0},
			{"decode-b32-mtp3-narrow", 64 << 10, 512, "mma4x", 99.3, 16.8}, {"prefill=16K", 0, 512, "mma4xe", 2406.9, 299.6}}},
		{"2026-12-02-h200-j/tscore/call2/bench.log", 56, 0, []want{{"decode-b32-mtp3", 64 << 10, 512, "mma4x", 157.1, 17.0},
			{"decode-b32-mtp3-narrow", 1 << 20, 512, "mma4x", 1244.7, 150.8}, {"chunk=1K-at-3K", 0, 512, "mma4u", 97.3, 17.0}}},
	} {
		t.Run(c.log, func(t *testing.T) {
			path := filepath.Join("..", "..", "bench", "results", filepath.FromSlash(c.log))
			raw, err := os.ReadFile(path)
			require.NoError(t, err)
			marked := strings.Count(string(raw), topkMarker)
			lg, err := readTopKLog(path, "x")
			require.NoError(t, err)
			assert.Len(t, lg.Readings, c.lines)
			assert.Equal(t, marked, c.lines+c.quoted, "every line with the marker read or quoted")
			for _, w := range c.has {
				found := false
				for _, r := range lg.Readings {
					if r.Batch == w.batch && r.Context == w.ctx && r.TopK == w.topk && r.Kernel == w.kernel && r.Us == w.us && r.SelectUs == w.sel {
						found = true
						assert.Positive(t, r.ScoreUs)
						assert.Positive(t, r.Int8FloorUs)
						assert.Positive(t, r.CacheFloorUs)
					}
				}
				assert.True(t, found, "%+v", w)
			}
		})
	}
}

// topkFixture writes a log in either form: two readings of each shape
// (the best is the smaller), shapes of another batch and index_topk that
// the plot leaves out, and lines of other kinds around them. cacheFloor is
// the 64K shape's cache floor, which sets the copy rate the log implies.
func topkFixture(t *testing.T, prefix string, cacheFloor float64) string {
	t.Helper()
	const line = "%sdecode-b32-mtp3/ctx=%s/topk=%d %s: %.1f us a layer (score alone 1.0, select alone %.1f); floors: cache %d bytes %.2f us, int8 %.2f us (100 row-entry pairs)"
	lines := []string{
		"goos: linux",
		"BenchmarkCUDATopK/decode-b32-mtp3/ctx=8K/topk=512/mma-16 3 1084677 ns/op 96.46 us/layer",
		fmt.Sprintf(line, prefix, "8K", 512, "mma", 97.5, 8.8, 4000000, 2.0, 2.13),
		fmt.Sprintf(line, prefix, "8K", 512, "mma", 96.5, 9.1, 4000000, 2.0, 2.13),
		fmt.Sprintf(line, prefix, "64K", 512, "mma", 736.9, 25.6, 32000000, cacheFloor, 17.32),
		fmt.Sprintf(line, prefix, "64K", 512, "mma", 737.3, 25.3, 32000000, cacheFloor, 17.32),
		fmt.Sprintf(line, prefix, "64K", 512, "dp4a", 828.3, 24.9, 32000000, cacheFloor, 17.32),
		fmt.Sprintf(line, prefix, "64K", 1024, "mma", 5.0, 1.0, 32000000, cacheFloor, 17.32),
		strings.Replace(fmt.Sprintf(line, prefix, "64K", 512, "mma4", 5.0, 1.0, 32000000, cacheFloor, 17.32), "mtp3/", "mtp3-narrow/", 1),
		prefix + "prefill=16K/topk=512 mma: 9667.0 us a layer (score alone 9096.3, select alone 514.5); floors: cache 278528 bytes 0.15 us, int8 277.76 us (33550336 row-entry pairs)",
		"PASS",
	}
	path := filepath.Join(t.TempDir(), "bench.log")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return path
}

func TestTopKSeries(t *testing.T) {
	a, err := readTopKLog(topkFixture(t, "    topk_test.go:261: ", 16), "first")
	require.NoError(t, err)
	b, err := readTopKLog(topkFixture(t, "", 8), "second")
	require.NoError(t, err)
	require.Len(t, a.Readings, 8)
	by := map[string]series{}
	var labels []string
	for _, s := range topkSeries([]topkLog{a, b}, "decode-b32-mtp3", 512, nil) {
		by[s.Label] = s
		labels = append(labels, s.Label)
	}
	assert.Equal(t, []string{"mma, first", "dp4a, first", "select alone, first", "mma, second", "dp4a, second", "select alone, second",
		"cache floor: the indexer-cache bytes at 4.00 TB/s (the fastest copy in the logs)",
		"int8 floor: the score's multiply-adds at the int8 peak"}, labels)
	assert.Equal(t, []point{{8192, 96.5}, {65536, 736.9}}, by["mma, first"].Points, "the best reading of each shape")
	assert.Equal(t, []point{{65536, 828.3}}, by["dp4a, second"].Points)
	assert.Equal(t, []point{{8192, 8.8}, {65536, 24.9}}, by["select alone, first"].Points, "the best select over every kernel's readings")
	cache := by["cache floor: the indexer-cache bytes at 4.00 TB/s (the fastest copy in the logs)"]
	assert.Equal(t, ceiling, cache.Kind)
	// 4e6 bytes at the second log's 32e6 bytes / 8 us, not the first's 16 us.
	assert.Equal(t, []point{{8192, 1}, {65536, 8}}, cache.Points)
	assert.Equal(t, []point{{8192, 2.13}, {65536, 17.32}}, by["int8 floor: the score's multiply-adds at the int8 peak"].Points)

	assert.False(t, hasMeasured(topkSeries([]topkLog{a}, "decode-b8-mtp1", 512, nil)), "no shape of another batch")
}

// TestTopKSeriesShortForm: readings without their bytes (the short form)
// take the bytes of the same shape in another log for the cache floor;
// a kernel named with its select gets its own select line; --kernels
// leaves the others out.
func TestTopKSeriesShortForm(t *testing.T) {
	full, err := readTopKLog(topkFixture(t, "", 8), "full")
	require.NoError(t, err)
	lines := []string{
		"decode-b32-mtp3/ctx=64K/topk=512 mma4q: 191.6 us a layer (score alone 158.2, select alone 21.5); floors cache 8.10, int8 17.32",
		"decode-b32-mtp3/ctx=64K/topk=512 mma4q: 191.1 us a layer (score alone 158.3, select alone 22.0); floors cache 8.10, int8 17.32",
		"decode-b32-mtp3/ctx=64K/topk=512 mma4+radix: 248.8 us a layer (score alone 212.4, select alone 25.7); floors cache 8.10, int8 17.32",
		"decode-b32-mtp3/ctx=128K/topk=512 mma4q: 335.9 us a layer (score alone 301.5, select alone 34.8); floors cache 19.83, int8 34.69",
	}
	path := filepath.Join(t.TempDir(), "short.log")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	short, err := readTopKLog(path, "short")
	require.NoError(t, err)
	by := map[string]series{}
	var labels []string
	for _, s := range topkSeries([]topkLog{full, short}, "decode-b32-mtp3", 512, regexp.MustCompile(`^(mma|mma4q|mma4\+radix)$`)) {
		by[s.Label] = s
		labels = append(labels, s.Label)
	}
	cacheLabel := "cache floor: the indexer-cache bytes at 4.00 TB/s (the fastest copy in the logs)"
	assert.Equal(t, []string{"mma, full", "select alone, full", "mma4q, short", "mma4+radix, short", "select alone, short", "select alone (radix), short",
		cacheLabel, "int8 floor: the score's multiply-adds at the int8 peak"}, labels, "dp4a left out")
	assert.Equal(t, []point{{65536, 191.1}, {131072, 335.9}}, by["mma4q, short"].Points)
	assert.Equal(t, []point{{65536, 21.5}, {131072, 34.8}}, by["select alone, short"].Points)
	assert.Equal(t, []point{{65536, 25.7}}, by["select alone (radix), short"].Points)
	// 64K: the full log's 32e6 bytes at its 4 TB/s (not the short log's
	// 8.10); 128K, which no log has with bytes: the short log's floor.
	assert.Equal(t, []point{{8192, 1}, {65536, 8}, {131072, 19.83}}, by[cacheLabel].Points)
}

func TestTopKWritesPlots(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, topkMain([]string{"--log", "one=" + topkFixture(t, "    topk_test.go:261: ", 16), "--log", topkFixture(t, "", 8),
		"--out-dir", dir}, &out, &bytes.Buffer{}))
	for _, ext := range []string{".png", ".svg"} {
		assert.Contains(t, out.String(), filepath.Join(dir, "topk-vs-context"+ext))
	}
	f, err := os.Open(filepath.Join(dir, "topk-vs-context.png"))
	require.NoError(t, err)
	img, err := png.Decode(f)
	f.Close()
	require.NoError(t, err)
	assert.Greater(t, img.Bounds().Dx(), 500)
	svg, err := os.ReadFile(filepath.Join(dir, "topk-vs-context.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(svg), "<svg")
	assert.Contains(t, string(svg), "mma, one", "the label given")
	assert.Contains(t, string(svg), "64K", "the context ticks")
}

func TestTopKErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.log")
	require.NoError(t, os.WriteFile(bad, []byte("ok\ndecode-b32-mtp3/ctx=64K/topk=512 mma: 737.3 us a layer (score alone 700.3, select\n"), 0o644))
	none := filepath.Join(dir, "none.log")
	require.NoError(t, os.WriteFile(none, []byte("PASS\n"), 0o644))
	good := topkFixture(t, "", 8)
	for _, c := range []struct {
		args []string
		err  string
	}{
		{nil, "no --log"},
		{[]string{"--log", filepath.Join(dir, "missing.log")}, "missing.log"},
		{[]string{"--log", bad}, "bad.log:2: malformed"},
		{[]string{"--log", none}, "no BenchmarkCUDATopK lines"},
		{[]string{"--log", good, "--topk", "2048", "--out-dir", dir}, "no decode-b32-mtp3 at index_topk 2048"},
		{[]string{"--log", good, "extra"}, "unexpected argument"},
		{[]string{"--log", good, "--kernels", "("}, "--kernels"},
		{[]string{"--log", good, "--kernels", "^nosuch$", "--out-dir", dir}, "no decode-b32-mtp3 at index_topk 512"},
	} {
		err := topkMain(c.args, &bytes.Buffer{}, &bytes.Buffer{})
		require.Error(t, err, c.args)
		assert.Contains(t, err.Error(), c.err)
	}
	assert.True(t, errors.Is(func() error { _, err := readTopKLog(bad, "x"); return err }(), errTopKLine))
}

func TestTokensLabel(t *testing.T) {
	for _, n := range []int{500, 8 << 10, 64 << 10, 128 << 10, 1 << 20, 3 << 20} {
		got, err := parseTokens(tokensLabel(n))
		require.NoError(t, err)
		assert.Equal(t, n, got, tokensLabel(n))
	}
	assert.Equal(t, "1M", tokensLabel(1024<<10))
	for _, s := range []string{"", "K", "-8K", "8G", "x"} {
		_, err := parseTokens(s)
		assert.Error(t, err, s)
	}
}
