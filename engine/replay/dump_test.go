package replay

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

func readI32s(b []byte) []int32 {
	out := make([]int32, len(b)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// TestDumpCarriesTheCacheModel: a dump of a compressed layer holds what a
// checker of the compressor needs: the window and the accept list in the
// metadata, the entries the iteration wrote with the pages holding them
// (the bytes the pool holds once the iteration committed), the block
// tables the iteration reserved, each sequence's state slot and the norm
// weight the engine holds. The dumped line is the trace's last, so the
// engine after the replay is as the dump left it.
func TestDumpCarriesTheCacheModel(t *testing.T) {
	m := dsv4.Flash()
	m.NumHeads = 2
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":122},{"seq":2,"tokens":9}]}
{"context":[{"seq":2,"tokens":40}],"generation":{"mtp":3,"seqs":[1]}}
{"context":[{"seq":3,"tokens":7}],"generation":{"mtp":3,"seqs":[1,2],"accept":[2,4]}}
`))
	require.NoError(t, err)
	dir := t.TempDir()
	opts := Options{
		Engine: engine.Config{
			Model: m, Cache: kvcache.Config{PageSize: 16, NumPages: 64, Window: 32},
			Backend: engine.BackendCPU, Layers: 4, MaxSeqs: 4, MaxTokens: 256, RopePositions: 1024,
			Compressor:       engine.CompressorConfig{Ratio4Pages: 8, Ratio128Pages: 4, MaxDrafts: 3},
			Input:            engine.InputProjected,
			SyntheticWeights: &engine.SyntheticWeights{Seed: 3},
		},
		Seed: 7, DumpDir: dir,
		DumpIteration: func(i int) bool { return i == 2 }, DumpLayer: func(int) bool { return true },
	}
	r, err := New(context.Background(), opts)
	require.NoError(t, err)
	defer r.Close()
	_, err = r.Run(context.Background(), steps, nil)
	require.NoError(t, err)
	e := r.Engine()
	for layer := range 4 {
		raw, err := os.ReadFile(filepath.Join(dir, DumpFileName(2, layer)))
		require.NoError(t, err)
		tensors, meta, err := safetensors.Read(raw)
		require.NoError(t, err)
		byName := map[string]safetensors.Tensor{}
		for _, tn := range tensors {
			byName[tn.Name] = tn
		}
		require.Equal(t, "32", meta["window"])
		require.Equal(t, "1:2,2:4", meta["accept"])
		require.Equal(t, []int32{7, 2, 4}, readI32s(byName["accepted"].Data), "seq 3's prompt, then the accept list")
		ratio := e.CompressRatio(layer)
		if ratio == 0 {
			require.NotContains(t, byName, "comp_entries", "layer %d has no compressor", layer)
			continue
		}
		require.Equal(t, map[int]string{4: "4", 128: "128"}[ratio], meta["compress_ratio"])
		seqs, cached, kvLen := []uint64{3, 1, 2}, readI32s(byName["cached"].Data), readI32s(byName["kv_len"].Data)
		require.Equal(t, []int32{0, 126, 49}, cached)

		// Every entry the iteration wrote, with its page.
		entries := readI32s(byName["comp_entries"].Data)
		tables := readI32s(byName["comp_block_tables"].Data)
		cols := byName["comp_block_tables"].Shape[1]
		var want []int32
		for b := range seqs {
			for i := cached[b] / int32(ratio); i < kvLen[b]/int32(ratio); i++ {
				want = append(want, int32(b), i, tables[b*cols+int(i)/engine.CompressedPageSize])
			}
		}
		require.Equal(t, want, entries, "layer %d", layer)
		require.NotEmpty(t, entries, "seq 1 reaches 128 tokens in the dumped iteration: both ratios write")
		// The committed block tables are prefixes of the reserved ones
		// (seq 1 keeps 2 of its 4 tokens: 128, entry 0 of ratio 128 too).
		for b, seq := range seqs {
			committed, err := e.Debug().CompressedBlockTable(ratio, seq)
			require.NoError(t, err)
			row := tables[b*cols : (b+1)*cols]
			require.Equal(t, slices.Clip(append([]int32{}, committed...)), row[:len(committed)], "layer %d seq %d", layer, seq)
		}
		// The pages' bytes are the pool's.
		pool, err := e.Debug().ReadCompressedPool(layer)
		require.NoError(t, err)
		pageBytes := kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize)
		ids := readI32s(byName["comp_page_ids"].Data)
		data := byName["comp_pages"].Data
		require.Len(t, data, len(ids)*pageBytes)
		for j, p := range ids {
			require.Equal(t, pool[int(p)*pageBytes:(int(p)+1)*pageBytes], data[j*pageBytes:(j+1)*pageBytes], "layer %d page %d", layer, p)
		}
		for k := 0; k < len(entries); k += 3 {
			require.True(t, slices.Contains(ids, entries[k+2]))
		}
		// The norm weight and the state slots.
		norm, err := e.Debug().CompressorNorm(layer)
		require.NoError(t, err)
		require.Equal(t, numerics.F32Bytes(norm), byName["comp_norm"].Data)
		st := byName["comp_states"]
		require.Equal(t, 3, st.Shape[0])
		require.Equal(t, meta["state_rows"], strconv.Itoa(st.Shape[1]))
		require.Equal(t, 2, st.Shape[2])
		require.Equal(t, e.CompressorWidth(layer), st.Shape[3])
		require.Len(t, st.Data, 3*st.Shape[1]*2*e.CompressorWidth(layer)*4)
		require.NotEqual(t, make([]byte, len(st.Data)), st.Data, "the slots hold the iteration's rows")
	}
}
