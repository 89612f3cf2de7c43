package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// The hand-off test plays a server's attention kernel: after each layer it
// binds to the engine's Handoff tensors alone and gathers what attention
// reads (each sequence's Q rows through cu_seqlens_q, the 128 window
// tokens of every sequence through block_table and cache_seqlens from
// k_cache, every compressed entry a sequence holds through
// extra_block_table from extra_k_cache, the scheduler scalars), and the
// test compares every gathered byte with what the engine's debug reads
// (ReadQ, ReadPool, ReadCompressedPool, the committed block tables) say
// those bytes must be. On the CPU backend the gatherer is Go over the
// host memory; on the CUDA backend it is a device kernel, launched on the
// engine's stream for even layers and, for odd layers, on a stream of its
// own ordered by events both ways (the Handoff's ordering rule).

const handoffEntryBytes = kvcache.UE8M0ValueBytes + kvcache.UE8M0ScaleBytes // 584

// handoffGather is what the attention player gathers from one layer.
type handoffGather struct {
	q      []byte // [MaxTokens][heads][512] Q elements: rows [0, padded_tokens)
	window []byte // [MaxSeqs][Window][584]: the window before kv_len; zeros before position 0 and past num_seqs
	comp   []byte // [MaxSeqs][entries][584]: entries [0, kv_len/r); zeros past them (nil: no compressor)
	sched  []byte // the 16 bytes of tile_id_counter, scale_bmm1, scale_bmm2
}

func handoffConfig(backend string, seed uint64) engine.Config {
	model := weights.TinyConfig() // layers of ratio 0, 4, 128 and the MTP layer
	if backend == engine.BackendCPU {
		// The GEMMs' cost under -race; nothing the hand-off reads depends
		// on it. The CUDA run keeps the tiny model's 256.
		model.HiddenSize = 128
	}
	return engine.Config{
		Model:            model,
		Cache:            kvcache.Config{PageSize: 16, NumPages: 96, Window: kvcache.DSv4Window},
		Backend:          backend,
		MaxSeqs:          8,
		MaxTokens:        512,
		RopePositions:    4096,
		Input:            engine.InputHidden,
		Compressor:       engine.CompressorConfig{Ratio4Pages: 16, Ratio128Pages: 4},
		SyntheticWeights: &engine.SyntheticWeights{Seed: seed},
	}
}

// gatherSizes are the bytes of each output of a layer.
func gatherSizes(h *engine.Handoff, layer int) (q, window, comp int) {
	q = h.Q.Bytes()
	window = h.BlockTable.Shape[0] * kvcache.DSv4Window * handoffEntryBytes
	if t := h.ExtraKCache[layer]; t.Buffer != nil {
		r := h.Ratio[layer]
		comp = h.ExtraBlockTable[r].Shape[0] * h.ExtraBlockTable[r].Shape[1] * engine.CompressedPageSize * handoffEntryBytes
	}
	return q, window, comp
}

// gatherHost is the attention player on the CPU backend: Go over the
// tensors' host memory.
func gatherHost(h *engine.Handoff, layer int) handoffGather {
	mem := func(t engine.Tensor) []byte { return cpu.Bytes(t.Buffer)[t.Offset:] }
	i32 := func(t engine.Tensor, i int) int { return int(int32(binary.LittleEndian.Uint32(mem(t)[4*i:]))) }
	nq, nw, nc := gatherSizes(h, layer)
	g := handoffGather{q: make([]byte, nq), window: make([]byte, nw), sched: make([]byte, mla.SchedulerBytes)}
	numSeqs, tokens, padded := i32(h.BatchHeader, mla.HdrNumSeqs), i32(h.BatchHeader, mla.HdrTokens), i32(h.BatchHeader, mla.HdrPaddedTokens)
	row := h.Q.Strides[0] * h.Q.DType.Size()
	q := mem(h.Q)
	for b := range numSeqs {
		lo, hi := i32(h.CuSeqlensQ, b), i32(h.CuSeqlensQ, b+1)
		copy(g.q[lo*row:hi*row], q[lo*row:hi*row])
	}
	copy(g.q[tokens*row:padded*row], q[tokens*row:padded*row])
	copy(g.sched, mem(h.TileIDCounter)[:mla.SchedulerBytes])

	P, pageSize := h.KCache[layer].Shape[1], h.PageSize
	pool := mem(h.KCache[layer])
	entry := func(dst, pool []byte, pageBytes, pageSize, page, off int) {
		base := page * pageBytes
		copy(dst[:kvcache.UE8M0ValueBytes], pool[base+off*kvcache.UE8M0ValueBytes:])
		copy(dst[kvcache.UE8M0ValueBytes:], pool[base+kvcache.UE8M0ValueBytes*pageSize+off*kvcache.UE8M0ScaleBytes:][:kvcache.UE8M0ScaleBytes])
	}
	W, stride := kvcache.DSv4Window, h.BlockTable.Strides[0]
	for b := range numSeqs {
		kv := i32(h.CacheSeqlens, b)
		for j := range W {
			pos := kv - W + j
			if pos < 0 {
				continue
			}
			page := i32(h.BlockTable, b*stride+pos/pageSize)
			entry(g.window[(b*W+j)*handoffEntryBytes:][:handoffEntryBytes], pool, P, pageSize, page, pos%pageSize)
		}
	}
	if nc > 0 {
		g.comp = make([]byte, nc)
		t := h.ExtraKCache[layer]
		r := h.Ratio[layer]
		bt := h.ExtraBlockTable[r]
		entries := bt.Shape[1] * engine.CompressedPageSize
		cpool := mem(t)
		for b := range numSeqs {
			n := i32(h.CacheSeqlens, b) / r
			for i := range min(n, entries) {
				page := i32(bt, b*bt.Strides[0]+i/engine.CompressedPageSize)
				entry(g.comp[(b*entries+i)*handoffEntryBytes:][:handoffEntryBytes], cpool, t.Shape[1], engine.CompressedPageSize, page, i%engine.CompressedPageSize)
			}
		}
	}
	return g
}

// handoffKernel is the attention player on the CUDA backend, one block per
// batch row of the capacity; every output byte of its row is written
// (zeros where nothing is visible), so the poison left anywhere shows a
// byte it missed.
const handoffKernel = `
#define ENTRY 584
#define VALUES 576
extern "C" __global__ void handoff_gather(
	const unsigned char* q, int q_row, const int* hdr, const int* cu_q, const int* kv_len,
	const int* block_table, int bt_stride, int page_size, int page_bytes, const unsigned char* k_cache,
	const int* extra_bt, int extra_stride, int ratio, int extra_page_bytes, const unsigned char* extra_k_cache,
	const unsigned char* sched, int window,
	unsigned char* out_q, unsigned char* out_window, unsigned char* out_comp, unsigned char* out_sched)
{
	const int b = blockIdx.x, num_seqs = hdr[0], tokens = hdr[5], padded = hdr[6];
	if (b < num_seqs) {
		for (long long i = (long long)cu_q[b] * q_row + threadIdx.x; i < (long long)cu_q[b + 1] * q_row; i += blockDim.x)
			out_q[i] = q[i];
	}
	if (b == 0) {
		for (long long i = (long long)tokens * q_row + threadIdx.x; i < (long long)padded * q_row; i += blockDim.x)
			out_q[i] = q[i];
		if (threadIdx.x < 16) out_sched[threadIdx.x] = sched[threadIdx.x];
	}
	const int kv = b < num_seqs ? kv_len[b] : 0;
	for (int i = threadIdx.x; i < window * ENTRY; i += blockDim.x) {
		const int j = i / ENTRY, k = i % ENTRY, pos = kv - window + j;
		unsigned char v = 0;
		if (b < num_seqs && pos >= 0) {
			const long long page = block_table[(long long)b * bt_stride + pos / page_size];
			const int off = pos % page_size;
			v = k < VALUES ? k_cache[page * page_bytes + off * VALUES + k]
			               : k_cache[page * page_bytes + (long long)VALUES * page_size + off * 8 + (k - VALUES)];
		}
		out_window[((long long)b * window + j) * ENTRY + k] = v;
	}
	if (ratio == 0) return;
	const int entries = extra_stride * 64, n = kv / ratio;
	for (long long i = threadIdx.x; i < (long long)entries * ENTRY; i += blockDim.x) {
		const int e = (int)(i / ENTRY), k = (int)(i % ENTRY);
		unsigned char v = 0;
		if (e < n) {
			const long long page = extra_bt[(long long)b * extra_stride + e / 64];
			const int off = e % 64;
			v = k < VALUES ? extra_k_cache[page * extra_page_bytes + off * VALUES + k]
			               : extra_k_cache[page * extra_page_bytes + (long long)VALUES * 64 + off * 8 + (k - VALUES)];
		}
		out_comp[(long long)b * entries * ENTRY + i] = v;
	}
}
`

// deviceGatherer runs handoffKernel on the engine's CUDA backend.
type deviceGatherer struct {
	b          *cuda.Backend
	fn         *driver.Function
	side       *driver.Stream
	done, read *driver.Event
	outs       []mla.Buffer // per layer: q, window, comp, sched
}

const handoffPoison = 0xA5

// newDeviceGatherer compiles the kernel and allocates its outputs; close
// frees them, before the engine closes its backend.
func newDeviceGatherer(t *testing.T, e *engine.Engine) (_ *deviceGatherer, close func()) {
	b := e.Backend().(*cuda.Backend)
	mod, err := b.Context().CompileModule(handoffKernel, "handoff_gather.cu", driver.CompileOptions{})
	require.NoError(t, err)
	d := &deviceGatherer{b: b}
	d.fn, err = mod.Function("handoff_gather")
	require.NoError(t, err)
	d.side, err = b.Context().NewStream()
	require.NoError(t, err)
	d.done, err = b.Context().NewEvent(false)
	require.NoError(t, err)
	d.read, err = b.Context().NewEvent(false)
	require.NoError(t, err)
	h := e.Handoff()
	for l := range e.Layers() {
		nq, nw, nc := gatherSizes(h, l)
		for _, n := range []int{nq, nw, max(nc, 1), mla.SchedulerBytes} {
			buf, err := b.Alloc(n)
			require.NoError(t, err)
			d.outs = append(d.outs, buf)
		}
	}
	return d, func() {
		require.NoError(t, d.side.Synchronize())
		for _, buf := range d.outs {
			require.NoError(t, b.Free(buf))
		}
		require.NoError(t, d.side.Destroy())
		require.NoError(t, d.done.Destroy())
		require.NoError(t, d.read.Destroy())
		require.NoError(t, mod.Unload())
	}
}

// poison fills every output with the poison byte, before the iteration.
func (d *deviceGatherer) poison(t *testing.T) {
	for _, buf := range d.outs {
		require.NoError(t, d.b.Fill(buf, 0, buf.Len(), handoffPoison))
	}
}

// launch gathers one layer right after its RunLayer: even layers on the
// engine's stream, odd layers on the side stream, which waits for an
// event recorded on the engine's stream, and the engine's stream then
// waits for the gather before the next layer rewrites q.
func (d *deviceGatherer) launch(t *testing.T, h *engine.Handoff, layer int) {
	ptr := func(t engine.Tensor) driver.DevicePtr {
		return t.Buffer.(*cuda.Buffer).Ptr() + driver.DevicePtr(t.Offset)
	}
	out := func(i int) driver.DevicePtr { return d.outs[4*layer+i].(*cuda.Buffer).Ptr() }
	pool := h.KCache[layer]
	pageSize := h.PageSize
	var ebt, ekc driver.DevicePtr
	var estride, ratio, epage int32
	if t := h.ExtraKCache[layer]; t.Buffer != nil {
		ratio = int32(h.Ratio[layer])
		bt := h.ExtraBlockTable[int(ratio)]
		ebt, ekc, estride, epage = ptr(bt), ptr(t), int32(bt.Strides[0]), int32(t.Shape[1])
	}
	args := []any{ptr(h.Q), int32(h.Q.Strides[0] * h.Q.DType.Size()), ptr(h.BatchHeader), ptr(h.CuSeqlensQ), ptr(h.CacheSeqlens),
		ptr(h.BlockTable), int32(h.BlockTable.Strides[0]), int32(pageSize), int32(pool.Shape[1]), ptr(pool),
		ebt, estride, ratio, epage, ekc, ptr(h.TileIDCounter), int32(kvcache.DSv4Window),
		out(0), out(1), out(2), out(3)}
	grid, block := driver.Dim3{uint32(h.BlockTable.Shape[0]), 1, 1}, driver.Dim3{256, 1, 1}
	main := d.b.Stream()
	if layer%2 == 0 {
		require.NoError(t, d.b.Context().Launch(d.fn, grid, block, 0, main, args...))
		return
	}
	require.NoError(t, d.done.Record(main))
	require.NoError(t, d.side.WaitEvent(d.done))
	require.NoError(t, d.b.Context().Launch(d.fn, grid, block, 0, d.side, args...))
	require.NoError(t, d.read.Record(d.side))
	require.NoError(t, main.WaitEvent(d.read))
}

// result reads one layer's outputs back, once the iteration ended.
func (d *deviceGatherer) result(t *testing.T, h *engine.Handoff, layer int) handoffGather {
	require.NoError(t, d.side.Synchronize())
	read := func(i int) []byte {
		buf := d.outs[4*layer+i]
		out := make([]byte, buf.Len())
		require.NoError(t, d.b.Read(out, buf, 0))
		return out
	}
	g := handoffGather{q: read(0), window: read(1), sched: read(3)}
	if h.ExtraKCache[layer].Buffer != nil {
		g.comp = read(2)
	}
	return g
}

// readTensor reads a tensor's whole extent through the backend.
func readTensor(t *testing.T, e *engine.Engine, x engine.Tensor) []int32 {
	raw := make([]byte, x.Bytes())
	require.NoError(t, e.Backend().Read(raw, x.Buffer, x.Offset))
	out := make([]int32, len(raw)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

func requireBytes(t *testing.T, want, got []byte, format string, args ...any) {
	t.Helper()
	require.Equal(t, len(want), len(got), append([]any{format}, args...)...)
	if i := bytediff.First(want, got); i >= 0 {
		t.Fatalf("%s: byte %d is %#02x, want %#02x", fmt.Sprintf(format, args...), i, got[i], want[i])
	}
}

// checkHandoff compares one layer's gathered bytes with what the engine's
// debug reads say, after the iteration ended: m is the iteration's
// metadata, q the Q buffer read after the layer ran.
func checkHandoff(t *testing.T, e *engine.Engine, m *metadata.Metadata, layer int, q []byte, g handoffGather, poisoned bool) {
	t.Helper()
	h := e.Handoff()
	what := fmt.Sprintf("layer %d", layer)
	row := h.Q.Strides[0] * h.Q.DType.Size()
	requireBytes(t, q, g.q[:m.PaddedTokens*row], "%s q", what)
	if poisoned {
		for i, v := range g.q[m.PaddedTokens*row:] {
			require.Equal(t, byte(handoffPoison), v, "%s q byte %d past the padded rows", what, m.PaddedTokens*row+i)
		}
	}
	requireBytes(t, mla.EncodeScheduler(m.Scheduler), g.sched, "%s scheduler scalars", what)

	cfg := e.Config()
	pool, err := e.Debug().ReadPool(layer)
	require.NoError(t, err)
	W, P := kvcache.DSv4Window, cfg.Cache.PageSize
	want := make([]byte, len(g.window))
	for b := range m.NumSeqs {
		for j := range W {
			pos := int(m.KVLen[b]) - W + j
			if pos < 0 {
				continue
			}
			page := int(m.BlockTables[b*m.MaxPages+pos/P])
			require.GreaterOrEqual(t, page, 0, "%s seq %d position %d: the window's page was freed", what, m.Seqs[b], pos)
			base := page * cfg.Cache.PageBytes()
			dst := want[(b*W+j)*handoffEntryBytes:]
			copy(dst[:kvcache.UE8M0ValueBytes], pool[base+cfg.Cache.Format.ValueOffset(P, pos%P):])
			copy(dst[kvcache.UE8M0ValueBytes:handoffEntryBytes], pool[base+cfg.Cache.Format.ScaleOffset(P, pos%P):])
		}
	}
	requireBytes(t, want, g.window, "%s window rows", what)

	if g.comp == nil {
		return
	}
	r := e.CompressRatio(layer)
	cpool, err := e.Debug().ReadCompressedPool(layer)
	require.NoError(t, err)
	bt := h.ExtraBlockTable[r]
	entries := bt.Shape[1] * engine.CompressedPageSize
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize)
	for b := range m.NumSeqs {
		seq := m.Seqs[b]
		n := int(m.KVLen[b]) / r
		committed, err := e.Debug().CompressedEntries(r, seq)
		require.NoError(t, err)
		table, err := e.Debug().CompressedBlockTable(r, seq)
		require.NoError(t, err)
		got := g.comp[b*entries*handoffEntryBytes : (b+1)*entries*handoffEntryBytes]
		// Entries past committed belong to rejected drafts (dead once End
		// committed the accepted length): only their count is checked.
		require.LessOrEqual(t, committed, n, "%s seq %d", what, seq)
		for i := range committed {
			page := int(table[i/engine.CompressedPageSize])
			off := i % engine.CompressedPageSize
			w := make([]byte, 0, handoffEntryBytes)
			w = append(w, cpool[page*pageBytes+off*kvcache.UE8M0ValueBytes:][:kvcache.UE8M0ValueBytes]...)
			w = append(w, cpool[page*pageBytes+kvcache.UE8M0ValueBytes*engine.CompressedPageSize+off*kvcache.UE8M0ScaleBytes:][:kvcache.UE8M0ScaleBytes]...)
			requireBytes(t, w, got[i*handoffEntryBytes:(i+1)*handoffEntryBytes], "%s seq %d ratio-%d entry %d", what, seq, r, i)
		}
		requireBytes(t, make([]byte, (entries-n)*handoffEntryBytes), got[n*handoffEntryBytes:], "%s seq %d entries past %d", what, seq, n)
	}
	for b := m.NumSeqs; b < bt.Shape[0]; b++ {
		requireBytes(t, make([]byte, entries*handoffEntryBytes), g.comp[b*entries*handoffEntryBytes:(b+1)*entries*handoffEntryBytes], "%s row %d past the batch", what, b)
	}
}

// checkMetadataTensors compares the per-iteration tensors, read through
// the backend, with the iteration's metadata and the committed compressed
// block tables.
func checkMetadataTensors(t *testing.T, e *engine.Engine, m *metadata.Metadata) {
	h := e.Handoff()
	n := m.NumSeqs
	hdr := readTensor(t, e, h.BatchHeader)
	require.Equal(t, []int32{int32(m.NumSeqs), int32(m.NumCtx), int32(m.NumGen), int32(m.CtxTokens), int32(m.GenTokens),
		int32(m.Tokens), int32(m.PaddedTokens), int32(m.GenSeqLen), int32(m.MaxPages)}, hdr)
	for _, c := range []struct {
		x    engine.Tensor
		want []int32
	}{{h.CacheSeqlens, m.KVLen}, {h.SeqlensQ, m.QLen}, {h.Cached, m.Cached}, {h.CuSeqlensQ, m.CuQ[:n+1]}, {h.CuSeqlensK, m.CuKV[:n+1]}, {h.CuQRows, m.CuQRows[:n+1]}} {
		got := readTensor(t, e, c.x)
		require.Equal(t, c.want, got[:len(c.want)], c.x.Name)
	}
	bt := readTensor(t, e, h.BlockTable)
	stride := h.BlockTable.Strides[0]
	for b := range h.BlockTable.Shape[0] {
		for j := range stride {
			want := int32(0)
			if b < n {
				want = -1
				if j < m.MaxPages {
					want = m.BlockTables[b*m.MaxPages+j]
				}
			}
			require.Equal(t, want, bt[b*stride+j], "block_table[%d][%d]", b, j)
		}
	}
	for r, x := range h.ExtraBlockTable {
		dev := readTensor(t, e, x)
		stride := x.Strides[0]
		for b := range x.Shape[0] {
			row := dev[b*stride : (b+1)*stride]
			if b >= n {
				require.Equal(t, make([]int32, stride), negate(row), "extra_block_table[%d] row %d past the batch: all -1", r, b)
				continue
			}
			table, err := e.Debug().CompressedBlockTable(r, m.Seqs[b])
			require.NoError(t, err)
			require.Equal(t, append([]int32{}, table...), row[:len(table)], "extra_block_table[%d] row %d: the committed pages", r, b)
			pages := (int(m.KVLen[b])/r + engine.CompressedPageSize - 1) / engine.CompressedPageSize
			require.Equal(t, make([]int32, stride-pages), negate(row[pages:]), "extra_block_table[%d] row %d past %d pages: -1", r, b, pages)
		}
	}
}

// negate maps -1 to 0 (and anything else to itself + 1): an all -1 row
// compares equal to zeros.
func negate(row []int32) []int32 {
	out := make([]int32, len(row))
	for i, v := range row {
		out[i] = v + 1
	}
	return out
}

// TestHandoff runs chunked prefill, MTP steps with Accept (through CUDA
// graphs on the CUDA backend), a mixed batch, an arrival and a Finish on
// DSv4's real layer (window, compressor, hidden input; the tiny model's
// ratio-0, 4 and 128 layers), and after every layer of every iteration
// plays the attention kernel on the Handoff tensors.
func TestHandoff(t *testing.T) {
	for _, backend := range []string{engine.BackendCPU, "cuda"} {
		t.Run(backend, func(t *testing.T) {
			if backend == "cuda" {
				requireCUDA(t, 1)
			}
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 26))
			e, err := engine.New(context.Background(), handoffConfig(backend, seed))
			require.NoError(t, err)
			defer func() { require.NoError(t, e.Close()) }()
			h := e.Handoff()
			require.Equal(t, h, e.Handoff(), "one description for the engine's life")
			var dev *deviceGatherer
			if backend == "cuda" {
				var closeDev func()
				dev, closeDev = newDeviceGatherer(t, e)
				defer closeDev()
			}
			ctx := context.Background()
			gen := func(mtp int, seqs ...uint64) []metadata.Request {
				var out []metadata.Request
				for _, s := range seqs {
					out = append(out, metadata.Request{Seq: s, Phase: metadata.Generation, MTP: mtp})
				}
				return out
			}
			steps := [][]metadata.Request{
				{ctxReq(1, 200), ctxReq(2, 70)},
				append([]metadata.Request{ctxReq(1, 111)}, gen(2, 2)...),
				gen(2, 1, 2),
				gen(2, 1, 2),
				append([]metadata.Request{ctxReq(3, 9)}, gen(1, 1, 2)...),
				gen(3, 1, 2, 3),
				nil, // Finish(2)
				gen(3, 1, 3),
				gen(0, 1, 3),
			}
			graphs := 0
			for i, reqs := range steps {
				if reqs == nil {
					require.NoError(t, e.Finish(2))
					continue
				}
				it, err := e.Begin(ctx, reqs)
				require.NoError(t, err, "step %d", i)
				if it.Debug().GraphPath() {
					graphs++
				}
				if dev != nil {
					dev.poison(t)
				}
				qs := make([][]byte, e.Layers())
				var host []handoffGather
				for l := range e.Layers() {
					hidden := make([]byte, 2*it.Tokens()*e.HiddenSize())
					for k := 0; k < len(hidden); k += 2 {
						binary.LittleEndian.PutUint16(hidden[k:], numerics.BF16FromF32(float32(rng.NormFloat64())))
					}
					require.NoError(t, it.SetHidden(l, hidden))
					require.NoError(t, it.RunLayer(ctx, l))
					if dev != nil {
						dev.launch(t, h, l)
					} else {
						host = append(host, gatherHost(h, l))
					}
					if qs[l], err = it.Debug().ReadQ(); err != nil {
						require.NoError(t, err)
					}
				}
				accepted := map[uint64]int{}
				m := it.Metadata()
				for b := m.NumCtx; b < m.NumSeqs; b++ {
					accepted[m.Seqs[b]] = 1 + rng.IntN(int(m.QLen[b]))
				}
				require.NoError(t, it.Accept(accepted))
				require.NoError(t, it.End(ctx))
				checkMetadataTensors(t, e, m)
				for l := range e.Layers() {
					g := handoffGather{}
					if dev != nil {
						g = dev.result(t, h, l)
					} else {
						g = host[l]
					}
					checkHandoff(t, e, m, l, qs[l], g, dev != nil)
				}
				require.NoError(t, e.Debug().CheckInvariants())
			}
			if backend == "cuda" {
				require.Positive(t, graphs, "generation-only steps replay CUDA graphs")
			}
		})
	}
}

func ctxReq(seq uint64, n int) metadata.Request {
	return metadata.Request{Seq: seq, Phase: metadata.Context, NewTokens: n}
}
