package tests

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// dumpFile is one parsed --dump file.
type dumpFile struct {
	t    map[string]safetensors.Tensor
	meta map[string]string
}

func (d dumpFile) int(t *testing.T, key string) int {
	n, err := strconv.Atoi(d.meta[key])
	require.NoError(t, err, key)
	return n
}

func (d dumpFile) f32(t *testing.T, key string) float32 {
	v, err := strconv.ParseFloat(d.meta[key], 32)
	require.NoError(t, err, key)
	return float32(v)
}

func (d dumpFile) ints(name string) []int64 {
	tn := d.t[name]
	size := 4
	if tn.DType == "I64" {
		size = 8
	}
	out := make([]int64, len(tn.Data)/size)
	for i := range out {
		if size == 4 {
			out[i] = int64(int32(binary.LittleEndian.Uint32(tn.Data[4*i:])))
		} else {
			out[i] = int64(binary.LittleEndian.Uint64(tn.Data[8*i:]))
		}
	}
	return out
}

func (d dumpFile) floats(name string) []float32 {
	b := d.t[name].Data
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func bf16s(b []byte) []float32 {
	out := make([]float32, len(b)/2)
	for i := range out {
		out[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return out
}

// normRope is docs/DESIGN.md section 4 steps 1-4 for one 512-value row, with
// the (cos, sin) row taken from the dump (w nil: the weightless Q norm).
func normRope(x, w, rope []float32) *[512]float32 {
	r := numerics.RMSInv(numerics.SumSquares(x), numerics.DefaultEps)
	var y [512]float32
	for i := range y {
		v := float32(x[i] * r)
		if w != nil {
			v = float32(v * w[i])
		}
		y[i] = numerics.RoundBF16(v)
	}
	for k := range numerics.RopePairs {
		i := numerics.NopeDim + 2*k
		y[i], y[i+1] = numerics.Rope(y[i], y[i+1], rope[2*k], rope[2*k+1])
	}
	return &y
}

// checkDump recomputes, from the dump file alone (as a PyTorch user would),
// every cache token the iteration wrote and every Q row, and compares.
func checkDump(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	tensors, meta, err := safetensors.Read(data)
	require.NoError(t, err)
	d := dumpFile{t: map[string]safetensors.Tensor{}, meta: meta}
	for _, tn := range tensors {
		d.t[tn.Name] = tn
	}
	for _, name := range []string{"latent", "q_in", "kv_weight", "rope", "positions", "slots", "seq_ids", "q_len", "kv_len",
		"cached", "cu_q_seqlens", "cu_kv_seqlens", "cu_q_rows", "block_tables", "scheduler_tile_counter", "scheduler_bmm1",
		"scheduler_bmm2", "q_out", "cache_page_ids", "cache_pages"} {
		require.Contains(t, d.t, name, path)
	}
	format, err := kvcache.ParseFormat(meta["cache_format"])
	require.NoError(t, err)
	qf, err := mla.ParseQFormat(meta["q_format"])
	require.NoError(t, err)
	pageSize, pageBytes := d.int(t, "page_size"), d.int(t, "page_bytes")
	heads, tokens, padded := d.int(t, "heads"), d.int(t, "tokens"), d.int(t, "padded_tokens")
	kvScale, qScale := d.f32(t, "kv_scale"), d.f32(t, "q_scale")
	require.Equal(t, format.PageBytes(pageSize), pageBytes)

	latent, w, rope := bf16s(d.t["latent"].Data), d.floats("kv_weight"), d.floats("rope")
	slots, positions := d.ints("slots"), d.ints("positions")
	require.Len(t, slots, tokens)

	// The slots agree with the block tables and positions.
	bt, maxPages := d.ints("block_tables"), d.t["block_tables"].Shape[1]
	cuQ, cached := d.ints("cu_q_seqlens"), d.ints("cached")
	for b := range len(cuQ) - 1 {
		for tk := cuQ[b]; tk < cuQ[b+1]; tk++ {
			pos := positions[tk]
			require.Equal(t, cached[b]+tk-cuQ[b], pos)
			require.Equal(t, bt[int64(b)*int64(maxPages)+pos/int64(pageSize)]*int64(pageSize)+pos%int64(pageSize), slots[tk])
		}
	}

	// Cache: every token of the iteration, encoded by the reference encoder
	// into a copy of its page, leaves the page unchanged.
	ids := d.ints("cache_page_ids")
	pages := d.t["cache_pages"].Data
	index := map[int64]int{}
	for i, p := range ids {
		index[p] = i
	}
	want := append([]byte(nil), pages...)
	for tk := range tokens {
		i, ok := index[slots[tk]/int64(pageSize)]
		require.True(t, ok, "token %d: its page is not in the dump", tk)
		y := normRope(latent[tk*512:(tk+1)*512], w, rope[tk*64:(tk+1)*64])
		require.NoError(t, kvcache.EncodeToken(format, want[i*pageBytes:(i+1)*pageBytes], pageSize, int(slots[tk]%int64(pageSize)), y, kvScale))
	}
	require.True(t, string(want) == string(pages), "%s: cache pages differ from the reference encoding", path)

	// Q: every real row, then zeros for padding.
	qIn, qOut := bf16s(d.t["q_in"].Data), d.t["q_out"].Data
	es := qf.ElemBytes()
	require.Len(t, qOut, padded*heads*512*es)
	for row := range tokens * heads {
		tk := row / heads
		y := normRope(qIn[row*512:(row+1)*512], nil, rope[tk*64:(tk+1)*64])
		got := qOut[row*512*es : (row+1)*512*es]
		for i, v := range y {
			if qf == mla.QBF16 {
				require.Equal(t, numerics.BF16FromF32(v), binary.LittleEndian.Uint16(got[2*i:]), "%s row %d element %d", path, row, i)
			} else {
				require.Equal(t, numerics.E4M3FromF32(float32(v*qScale)), got[i], "%s row %d element %d", path, row, i)
			}
		}
	}
	require.Equal(t, make([]byte, (padded-tokens)*heads*512*es), qOut[tokens*heads*512*es:])
}

// TestDumpIsSelfContained replays a trace with every iteration and layer
// dumped, in each cache format and Q format, and checks each file from its
// own tensors: inputs, RoPE rows, slots and metadata are enough to recompute
// the outputs byte for byte.
func TestDumpIsSelfContained(t *testing.T) {
	steps, err := trace.Parse(strings.NewReader(verifyTrace))
	require.NoError(t, err)
	for _, c := range []struct {
		format  kvcache.Format
		q       mla.QFormat
		qScale  float32
		kvScale float32
		graphs  bool
	}{
		{kvcache.FormatFP8UE8M0, mla.QFP8, 1, 0, false},
		{kvcache.FormatBF16, mla.QBF16, 0, 0, true},
		{kvcache.FormatFP8PerTensor, mla.QFP8, 0.25, 2, false},
	} {
		t.Run(c.format.String(), func(t *testing.T) {
			dir := t.TempDir()
			opts := replayOptions(t, steps, 16)
			opts.Engine.Layers = 3 // Flash layer 2 uses YaRN
			opts.Engine.Cache.Format, opts.Engine.Cache.KVScale = c.format, c.kvScale
			opts.Engine.QFormat, opts.Engine.QScale = c.q, c.qScale
			opts.Engine.Eager = !c.graphs
			opts.DumpDir = dir
			r, err := replay.New(context.Background(), opts)
			require.NoError(t, err)
			defer r.Close()
			_, err = r.Run(context.Background(), steps, nil)
			require.NoError(t, err)
			files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
			require.NoError(t, err)
			require.Len(t, files, 3*3)
			for _, f := range files {
				checkDump(t, f)
			}
		})
	}
}
