package engine

import (
	"fmt"
	"unsafe"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// DType is the element type of a Tensor.
type DType uint8

const (
	Int32 DType = iota
	Uint32
	Float32
	BF16
	E4M3
	// Uint8 is raw bytes: the packed pages of a KV cache pool, whose entry
	// format Tensor.Layout names.
	Uint8
)

// Size is the bytes of one element.
func (d DType) Size() int {
	switch d {
	case Int32, Uint32, Float32:
		return 4
	case BF16:
		return 2
	}
	return 1
}

func (d DType) String() string {
	switch d {
	case Int32:
		return "int32"
	case Uint32:
		return "uint32"
	case Float32:
		return "float32"
	case BF16:
		return "bf16"
	case E4M3:
		return "e4m3"
	case Uint8:
		return "uint8"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Lifetime says when the engine rewrites a Tensor's contents. Its Buffer,
// Offset, Shape and Strides never change while the engine lives, so a
// kernel (or a CUDA graph) bound to them once stays bound.
type Lifetime uint8

const (
	// PerIteration: Begin writes it (on the CUDA backend, a copy enqueued
	// on the engine's stream ahead of the iteration's launches), every
	// layer of the iteration reads the same contents, the next Begin
	// rewrites it.
	PerIteration Lifetime = iota
	// PerLayer: each RunLayer rewrites it (the Q buffer and the scheduler
	// scalars): valid from that RunLayer until the next layer's.
	PerLayer
	// Persistent: a cache pool. A layer's RunLayer writes the slots (or
	// compressed entries) of the iteration's tokens; committed ones keep
	// their bytes until their sequence finishes or, in the SWA pool, the
	// window leaves them behind (their page then goes back to the pool).
	Persistent
)

func (l Lifetime) String() string {
	switch l {
	case PerIteration:
		return "per-iteration"
	case PerLayer:
		return "per-layer"
	case Persistent:
		return "persistent"
	}
	return fmt.Sprintf("Lifetime(%d)", uint8(l))
}

// Tensor is one backend buffer region an attention kernel binds to: on the
// CUDA backend device memory at Buffer.(*cuda.Buffer).Ptr() + Offset, on
// the CPU backend host memory at cpu.Bytes(Buffer)[Offset:].
type Tensor struct {
	// Name is what attention kernels call the argument (FlashMLA's sparse
	// decode, a varlen FMHA); where none has one, the name DESIGN.md uses.
	Name   string
	Buffer mla.Buffer
	Offset int // bytes from the start of Buffer to element 0
	DType  DType
	// Shape is the capacity, fixed for the engine's life; how much of it
	// an iteration fills is in the header (Handoff.BatchHeader) on the
	// backend and in Iteration.Metadata on the host.
	Shape []int
	// Strides are in elements, one per dimension (row-major, contiguous
	// unless a stride says otherwise).
	Strides  []int
	Lifetime Lifetime
	// Layout is what an element or entry holds, and the DESIGN.md section
	// that defines it.
	Layout string
}

// Bytes is the tensor's extent in its buffer: its capacity in bytes.
func (t Tensor) Bytes() int {
	if len(t.Shape) == 0 {
		return 0
	}
	return t.Shape[0] * t.Strides[0] * t.DType.Size()
}

// Handoff is what a server's attention kernel binds to: every buffer the
// engine writes for attention, named after the attention kernels'
// arguments, with its layout and lifetime. Engine.Handoff returns it; it
// stays valid (the same buffers at the same addresses) until Close.
//
// What a kernel reads, per layer l of an iteration:
//
//   - Q: q. [MaxTokens][heads][512] of the engine's QFormat, token row t
//     of the iteration at row t, head h of the engine's head range at
//     [t][h]; rows [Tokens, Rows) are padding, written as zeros. Each row
//     is [448 nope | 64 rope]; e4m3 with the per-tensor scale
//     Config.QScale, or bf16 (DESIGN.md section 3).
//   - the SWA cache: k_cache (FlashMLA's sparse decode; the paged
//     kv_cache of a dense MLA decode). KCache[l] is layer l's pool,
//     [NumPages][PageBytes] bytes of Config.Cache.Format's page layout:
//     for fp8_ue8m0 (584 bytes a token, FlashMLA's DSv4 layout), token
//     slot s at page s >> log2 P, in-page offset o = s & (P-1): 448 e4m3
//     and 64 bf16 at o*576, 7 UE8M0 exponents at 576*P + o*8 (DESIGN.md
//     section 3). A token's slot is BlockTable[b][pos >> log2 P]*P + (pos
//     & (P-1)) (section 5), which is what FlashMLA's sparse decode takes
//     as indices: the window of a token at position p is the positions
//     [max(0, p-127), p] (section 8).
//   - the compressed caches: extra_k_cache (FlashMLA's DSv4 sparse
//     decode). ExtraKCache[l] is layer l's pool of its compress ratio r
//     (the zero Tensor for a layer without one), [pages][PageBytes(64)]
//     bytes: the same fp8_ue8m0 entries, 64 a page, entry i of a
//     sequence at ExtraBlockTable[r][b][i >> 6]*64 + (i & 63), the index
//     FlashMLA calls extra_indices_in_kvcache. A token at position p sees
//     entries [0, floor((p+1)/r)); after layer l ran, sequence b holds
//     floor(kv_len[b]/r) of them (DESIGN.md section 8). The indexer's
//     top-k picks among them in the ratio-4 layers.
//   - indices (FlashMLA's sparse attention; the indexer's top-k, DESIGN.md
//     section 9): Indices[l] of a ratio-4 layer with the indexer's compute
//     (the zero Tensor otherwise), [MaxTokens][index_topk] int32: row t
//     the entry indices token row t selects among its sequence's ratio-4
//     entries, ascending, then -1 (fewer visible entries than index_topk);
//     padding rows [Tokens, Rows) all -1, rows past Rows not written. Entry i of batch sequence b is compressed slot
//     ExtraBlockTable[4][b][i >> 6]*64 + (i & 63) of ExtraKCache[l].
//     RunLayer(l) writes it, last of the layer's work on the engine's
//     stream (after the indexer's query and, joined, its key step); it
//     keeps its contents until the next iteration's RunLayer(l).
//   - block_table: [MaxSeqs][PageStride] int32, row b the pages of batch
//     sequence b by position (page j covers positions [jP, (j+1)P)); -1
//     for a page the window freed and past the sequence's kv_len; rows
//     past num_seqs are 0.
//   - ExtraBlockTable[r] (extra_block_table, our name: FlashMLA takes the
//     indices it yields): [MaxSeqs][stride] int32 per compress ratio, row
//     b the compressed pages of batch sequence b by entry index (page j
//     holds entries [64j, 64j+64)), -1 past them and in rows past
//     num_seqs. Shared by every layer of the ratio.
//   - cache_seqlens: kv_len per batch sequence, [MaxSeqs] int32 (FlashMLA;
//     a varlen FMHA's seqused_k): cached + new tokens.
//   - SeqlensQ (q_len): the new tokens of each sequence, [MaxSeqs] int32.
//   - Cached: kv_len - q_len, the tokens before this iteration's.
//   - cu_seqlens_q and cu_seqlens_k: [MaxSeqs+1] int32 prefix sums of
//     q_len and kv_len (a varlen FMHA's); CuQRows (cu_q_rows) of q_len *
//     heads, the FMHA's Q rows with the heads folded in.
//   - BatchHeader: [9] int32, num_seqs, num_ctx, num_gen, ctx_tokens,
//     gen_tokens, tokens, padded_tokens, gen_seq_len, max_pages (indices
//     mla.HdrNumSeqs...): a kernel captured in a CUDA graph reads the
//     batch's counts here, not from the host.
//   - tile_id_counter, scale_bmm1 [2], scale_bmm2 (an FMHA's scheduler
//     scalars, DESIGN.md section 5): written by each layer's first launch
//     (tile_id_counter reset to 0).
//
// Batch sequence b is the b-th request of the batch given to Begin
// (context requests first); its id is Iteration.Metadata().Seqs[b].
//
// Ordering. On the CPU backend every call has finished its writes when it
// returns. On the CUDA backend the engine issues an iteration's work on
// one stream, Engine.Backend().(*cuda.Backend).Stream(): Begin's copies of
// the metadata, block tables and compressor plans, and each RunLayer's
// kernels, the work RunLayer forks to a second stream joined back into
// it before RunLayer returns. So a kernel launched on that stream after
// RunLayer(l) returns reads layer l's outputs and the iteration's
// metadata, and the engine's later writes (the next RunLayer's q, the
// next Begin's copies) are ordered after it; nothing else is needed, and
// a CUDA graph captured on that stream gets the same order. A kernel on
// another stream must wait for an event recorded on the engine's stream
// after RunLayer(l) (cuEventRecord, cuStreamWaitEvent), and the engine's
// stream must wait for one recorded after that kernel before the next
// RunLayer (which rewrites q and the scheduler scalars) or the next
// Begin: End waits only for the engine's own streams. Either way, run a
// layer's attention before the iteration's End: with Iteration.Accept,
// End makes the rejected drafts' slots dead, and the window may free
// pages.
type Handoff struct {
	// PageSize is the SWA pool's tokens a page (P above); Ratio[l] is
	// layer l's compress ratio where ExtraKCache[l] is set, else 0.
	PageSize int
	Ratio    []int

	Q           Tensor
	KCache      []Tensor // per layer: k_cache
	ExtraKCache []Tensor // per layer: extra_k_cache; the zero Tensor (nil Buffer) for a layer without a compressor
	Indices     []Tensor // per layer: indices; the zero Tensor for a layer without the indexer's selection
	BlockTable  Tensor
	// ExtraBlockTable holds, per compress ratio the engine's layers use
	// (4, 128), the compressed pages' block tables; empty without the
	// compressor.
	ExtraBlockTable map[int]Tensor
	CacheSeqlens    Tensor
	SeqlensQ        Tensor
	Cached          Tensor
	CuSeqlensQ      Tensor
	CuSeqlensK      Tensor
	CuQRows         Tensor
	BatchHeader     Tensor
	TileIDCounter   Tensor
	ScaleBMM1       Tensor
	ScaleBMM2       Tensor
}

// Tensors lists every tensor of the hand-off, the per-layer ones in layer
// order (none for a layer without a compressed pool).
func (h *Handoff) Tensors() []Tensor {
	out := []Tensor{h.Q}
	out = append(out, h.KCache...)
	for _, t := range h.ExtraKCache {
		if t.Buffer != nil {
			out = append(out, t)
		}
	}
	for _, t := range h.Indices {
		if t.Buffer != nil {
			out = append(out, t)
		}
	}
	out = append(out, h.BlockTable)
	for _, r := range []int{4, 128} {
		if t, ok := h.ExtraBlockTable[r]; ok {
			out = append(out, t)
		}
	}
	return append(out, h.CacheSeqlens, h.SeqlensQ, h.Cached, h.CuSeqlensQ, h.CuSeqlensK, h.CuQRows,
		h.BatchHeader, h.TileIDCounter, h.ScaleBMM1, h.ScaleBMM2)
}

// Handoff returns the buffers the engine writes for attention, with their
// layouts and lifetimes (see Handoff).
func (e *Engine) Handoff() *Handoff { return e.handoff }

// buildHandoff describes the engine's buffers once, after New allocated
// them.
func (e *Engine) buildHandoff() *Handoff {
	cfg := e.cfg
	heads := cfg.heads()
	h := &Handoff{PageSize: cfg.Cache.PageSize, Ratio: make([]int, cfg.Layers), ExtraBlockTable: map[int]Tensor{}}
	qType, qLayout := E4M3, fmt.Sprintf("[448 nope | 64 rope] e4m3 with the per-tensor scale %g (DESIGN.md section 3)", cfg.QScale)
	if cfg.QFormat == mla.QBF16 {
		qType, qLayout = BF16, "[448 nope | 64 rope] bf16 (DESIGN.md section 3)"
	}
	h.Q = Tensor{Name: "q", Buffer: e.qOut, DType: qType, Shape: []int{cfg.MaxTokens, heads, numerics.HeadDim},
		Strides: []int{heads * numerics.HeadDim, numerics.HeadDim, 1}, Lifetime: PerLayer, Layout: qLayout}
	pageBytes := cfg.Cache.PageBytes()
	for l := range cfg.Layers {
		h.KCache = append(h.KCache, Tensor{Name: "k_cache", Buffer: e.pools[l], DType: Uint8,
			Shape: []int{cfg.Cache.NumPages, pageBytes}, Strides: []int{pageBytes, 1}, Lifetime: Persistent,
			Layout: fmt.Sprintf("layer %d: pages of %d %v tokens (DESIGN.md section 3), slot = block_table[b][pos/%d]*%d + pos%%%d (section 5)",
				l, cfg.Cache.PageSize, cfg.Cache.Format, cfg.Cache.PageSize, cfg.Cache.PageSize, cfg.Cache.PageSize)})
	}
	h.ExtraKCache = make([]Tensor, cfg.Layers)
	entryPage := kvcache.FormatFP8UE8M0.PageBytes(CompressedPageSize)
	for l := range cfg.Layers {
		pool, ratio := e.compressedPool(l)
		if pool == nil {
			continue
		}
		pages := pool.Len() / entryPage
		h.Ratio[l] = ratio
		h.ExtraKCache[l] = Tensor{Name: "extra_k_cache", Buffer: pool, DType: Uint8, Shape: []int{pages, entryPage},
			Strides: []int{entryPage, 1}, Lifetime: Persistent,
			Layout: fmt.Sprintf("layer %d, ratio %d: pages of %d fp8_ue8m0 entries (DESIGN.md sections 3, 8), entry i at extra_block_table[%d][b][i/%d]*%d + i%%%d",
				l, ratio, CompressedPageSize, ratio, CompressedPageSize, CompressedPageSize, CompressedPageSize)}
	}
	h.Indices = make([]Tensor, cfg.Layers)
	for l := range cfg.Layers {
		buf := e.IndexerTopK(l)
		if buf == nil {
			continue
		}
		k := e.IndexTopK()
		h.Indices[l] = Tensor{Name: "indices", Buffer: buf, DType: Int32, Shape: []int{cfg.MaxTokens, k}, Strides: []int{k, 1},
			Lifetime: PerLayer, Layout: fmt.Sprintf("layer %d: each token row's %d selected ratio-4 entry indices, ascending, then -1; padding rows -1; entry i at extra_block_table[4][b][i/%d]*%d + i%%%d (DESIGN.md section 9); kept until the layer's next RunLayer",
				l, k, CompressedPageSize, CompressedPageSize, CompressedPageSize)}
	}
	mb := e.meta
	i32 := func(name string, off int, n int, layout string) Tensor {
		return Tensor{Name: name, Buffer: mb.Buf, Offset: off, DType: Int32, Shape: []int{n}, Strides: []int{1},
			Lifetime: PerIteration, Layout: layout}
	}
	h.BlockTable = Tensor{Name: "block_table", Buffer: mb.Buf, Offset: mb.OffBlockTables, DType: Int32,
		Shape: []int{mb.MaxSeqs, mb.PageStride}, Strides: []int{mb.PageStride, 1}, Lifetime: PerIteration,
		Layout: "page of each sequence's positions [jP, (j+1)P); -1: freed by the window or past kv_len; rows past num_seqs 0 (DESIGN.md section 5)"}
	if e.comp != nil {
		for _, r := range e.comp.ratios {
			ct := e.compTables
			h.ExtraBlockTable[r] = Tensor{Name: "extra_block_table", Buffer: ct.buf, Offset: ct.off[r], DType: Int32,
				Shape: []int{cfg.MaxSeqs, ct.stride[r]}, Strides: []int{ct.stride[r], 1}, Lifetime: PerIteration,
				Layout: fmt.Sprintf("ratio %d: compressed page of each sequence's entries [64j, 64j+64); -1 past them and in rows past num_seqs (DESIGN.md section 8)", r)}
		}
	}
	h.CacheSeqlens = i32("cache_seqlens", mb.OffKVLen, mb.MaxSeqs, "kv_len: cached + new tokens of each sequence (DESIGN.md section 5)")
	h.SeqlensQ = i32("seqlens_q", mb.OffQLen, mb.MaxSeqs, "q_len: new tokens of each sequence (DESIGN.md section 5)")
	h.Cached = i32("cached", mb.OffCached, mb.MaxSeqs, "kv_len - q_len (DESIGN.md section 5)")
	h.CuSeqlensQ = i32("cu_seqlens_q", mb.OffCuQ, mb.MaxSeqs+1, "prefix sums of q_len (DESIGN.md section 5)")
	h.CuSeqlensK = i32("cu_seqlens_k", mb.OffCuKV, mb.MaxSeqs+1, "prefix sums of kv_len (DESIGN.md section 5)")
	h.CuQRows = i32("cu_q_rows", mb.OffCuQRows, mb.MaxSeqs+1, "prefix sums of q_len*heads (DESIGN.md section 5)")
	h.BatchHeader = i32("batch_header", mb.OffHeader, mla.NumHdrFields,
		"num_seqs, num_ctx, num_gen, ctx_tokens, gen_tokens, tokens, padded_tokens, gen_seq_len, max_pages (mla.HdrNumSeqs...)")
	sched := func(name string, word int, d DType, n int, layout string) Tensor {
		return Tensor{Name: name, Buffer: mb.Buf, Offset: mb.OffScheduler + 4*word, DType: d, Shape: []int{n}, Strides: []int{1},
			Lifetime: PerLayer, Layout: layout}
	}
	h.TileIDCounter = sched("tile_id_counter", mla.SchedTileCounter, Uint32, 1, "0, reset by each layer's first launch (DESIGN.md section 5)")
	h.ScaleBMM1 = sched("scale_bmm1", mla.SchedBMM1, Float32, 2, "q_deq*kv_deq/(q_scaling*sqrt(512)), times log2(e) (DESIGN.md section 5)")
	h.ScaleBMM2 = sched("scale_bmm2", mla.SchedBMM2, Float32, 1, "o_scale*kv_deq (DESIGN.md section 5)")
	return h
}

// compTableStride is the width of a ratio's device block tables: the
// compressed pages one sequence's entries can span, floor(RopePositions/r)
// entries, bounded by the ratio's pool.
func (c Config) compTableStride(ratio int) int {
	entries := c.RopePositions / ratio
	return max(1, min(c.Compressor.pagesFor(ratio), (entries+CompressedPageSize-1)/CompressedPageSize))
}

// compTableBytes is the device buffer of every ratio's block tables.
func (c Config) compTableBytes() int {
	n := 0
	for _, r := range c.compressedRatios() {
		n += align16(c.MaxSeqs * c.compTableStride(r) * 4)
	}
	return n
}

// compDeviceTables is the backend copy of each ratio's compressed block
// tables (Handoff.ExtraBlockTable), rewritten by each Begin from the
// reservation's tables. Like the metadata buffer (mla.MetadataBuffers) it
// keeps a host mirror of the device words and copies only the span that
// changed: between decode steps a sequence gains a compressed page only
// every 64 entries, so most Begins copy nothing.
type compDeviceTables struct {
	buf    mla.Buffer
	off    map[int]int // byte offset of each ratio's tables
	stride map[int]int // row width of each ratio's tables, in entries
	// words mirrors buf (staging memory on an mla.AsyncWriter backend);
	// widths[ratio index][b] is how many leading entries of row b are not
	// -1 in it. stale: the device holds an unknown mix, rewrite it all.
	words  []int32
	raw    []byte
	async  mla.AsyncWriter
	widths [][]int
	stale  bool
}

// newCompTables allocates the device tables, filled with -1.
func (e *Engine) newCompTables(alloc func(what string, n int, fill byte) (mla.Buffer, error)) error {
	cfg := e.cfg
	if len(cfg.compressedRatios()) == 0 {
		return nil
	}
	ct := &compDeviceTables{off: map[int]int{}, stride: map[int]int{}}
	n := 0
	for _, r := range cfg.compressedRatios() {
		ct.off[r], ct.stride[r] = n, cfg.compTableStride(r)
		n += align16(cfg.MaxSeqs * ct.stride[r] * 4)
		ct.widths = append(ct.widths, make([]int, cfg.MaxSeqs))
	}
	var err error
	if ct.buf, err = alloc("compressed block tables", n, 0xFF); err != nil {
		return err
	}
	// The mirror's words are the device's little-endian int32s as they are
	// (every platform the backends run on is little-endian).
	if aw, ok := e.backend.(mla.AsyncWriter); ok {
		if ct.raw, err = aw.AllocStaging(n); err != nil {
			return fmt.Errorf("engine: staging memory for the compressed block tables: %w", err)
		}
		ct.async = aw
		ct.words = unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(ct.raw))), n/4)
	} else {
		ct.words = make([]int32, n/4)
		ct.raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ct.words))), n)
	}
	for i := range ct.words {
		ct.words[i] = -1
	}
	e.compTables = ct
	return nil
}

// uploadCompTables writes the open iteration's compressed block tables
// (numSeqs rows per ratio, in batch order) to the backend: the span of
// words that changed, asynchronously where the backend can.
func (e *Engine) uploadCompTables(numSeqs int) error {
	ct := e.compTables
	if ct == nil {
		return nil
	}
	if ct.async != nil {
		if err := ct.async.WaitWrites(ct.raw); err != nil {
			return fmt.Errorf("engine: Begin: waiting for the last compressed block tables' copy: %w", err)
		}
	}
	lo, hi := len(ct.words), 0
	if ct.stale {
		lo, hi = 0, len(ct.words)
	}
	for ri, r := range e.comp.ratios {
		tables := e.compressedTables(ri)
		base, stride, widths := ct.off[r]/4, ct.stride[r], ct.widths[ri]
		for b := range widths {
			var row []int32
			if b < numSeqs {
				row = tables[b]
			} else if widths[b] == 0 {
				continue
			}
			if len(row) > stride {
				ct.stale = true
				return fmt.Errorf("engine: Begin: sequence %d spans %d ratio-%d compressed pages, more than the table width %d", b, len(row), r, stride)
			}
			words := ct.words[base+b*stride : base+(b+1)*stride]
			for j := range max(len(row), widths[b]) {
				v := int32(-1)
				if j < len(row) {
					v = row[j]
				}
				if words[j] != v {
					words[j] = v
					lo, hi = min(lo, base+b*stride+j), max(hi, base+b*stride+j+1)
				}
			}
			widths[b] = len(row)
		}
	}
	if lo >= hi {
		return nil
	}
	src := ct.raw[4*lo : 4*hi]
	var err error
	if ct.async != nil {
		err = ct.async.WriteAsync(ct.buf, 4*lo, src)
	} else {
		err = e.backend.Write(ct.buf, 4*lo, src)
	}
	if err != nil {
		ct.stale = true
		return fmt.Errorf("engine: Begin: uploading the compressed block tables: %w", err)
	}
	ct.stale = false
	return nil
}

// The compressor's state that the hand-off reads, in one place (the
// compressed pools' bookkeeping may move to a package of its own).

// compressedPool returns a layer's compressed pool and its ratio (nil, 0
// for a layer without a compressor).
func (e *Engine) compressedPool(layer int) (mla.Buffer, int) {
	if e.comp == nil || e.comp.layers[layer] == nil {
		return nil, 0
	}
	cl := e.comp.layers[layer]
	return cl.pool, cl.ratio
}

// compressedTables returns the open iteration's block tables of the ratio
// at index ri of e.comp.ratios, one row per batch sequence, as Begin
// reserved them.
func (e *Engine) compressedTables(ri int) [][]int32 { return e.comp.tables[ri] }
