package replay

import (
	"encoding/binary"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// DumpFileName is the file a dump of (iteration, layer) is written to.
func DumpFileName(iteration, layer int) string {
	return fmt.Sprintf("iter%05d_layer%02d.safetensors", iteration, layer)
}

func i32s(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

func i64s[T int64 | uint64](v []T) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(x))
	}
	return b
}

// dump writes the inputs and outputs of one layer of the open iteration
// (the tensor names are listed in the README, "cmd/decode dump tensors"),
// the cache model's part of it included: the window and the line's accept
// list (accepted: nil for all) in the metadata, and in a compressed layer
// the entries written, the pages holding them, the block tables, the
// state slots and the norm weight.
func (r *Replayer) dump(it *engine.Iteration, line, layer int, accepted map[uint64]int) (string, error) {
	e := r.eng
	cfg := e.Config()
	m := it.Metadata()
	heads, T, B := e.Heads(), m.Tokens, m.NumSeqs

	latent, err := it.Debug().ReadLatent()
	if err != nil {
		return "", err
	}
	qIn, err := it.Debug().ReadQIn()
	if err != nil {
		return "", err
	}
	qOut, err := it.Debug().ReadQ()
	if err != nil {
		return "", err
	}
	sched, err := it.Debug().Scheduler()
	if err != nil {
		return "", err
	}
	w, err := e.Debug().LayerWeight(layer)
	if err != nil {
		return "", err
	}
	table, err := e.Debug().RopeTable(layer)
	if err != nil {
		return "", err
	}
	positions := m.Positions()[:T]
	rope := make([]float32, 0, T*numerics.RopeDim)
	for _, p := range positions {
		rope = append(rope, table.Row(int(p))...)
	}
	pages := it.Debug().WrittenPages()
	var pageBytes []byte
	for _, p := range pages {
		b, err := e.Debug().ReadPage(layer, int(p))
		if err != nil {
			return "", err
		}
		pageBytes = append(pageBytes, b...)
	}
	qType := "F8_E4M3"
	if cfg.QFormat == mla.QBF16 {
		qType = "BF16"
	}
	tensors := []safetensors.Tensor{
		{Name: "latent", DType: "BF16", Shape: []int{T, numerics.HeadDim}, Data: latent},
		{Name: "q_in", DType: "BF16", Shape: []int{T, heads, numerics.HeadDim}, Data: qIn},
		{Name: "kv_weight", DType: "F32", Shape: []int{numerics.HeadDim}, Data: numerics.F32Bytes(w)},
		{Name: "rope", DType: "F32", Shape: []int{T, numerics.RopePairs, 2}, Data: numerics.F32Bytes(rope)},
		{Name: "positions", DType: "I32", Shape: []int{T}, Data: i32s(positions)},
		{Name: "slots", DType: "I64", Shape: []int{T}, Data: i64s(m.Slots()[:T])},
		{Name: "seq_ids", DType: "I64", Shape: []int{B}, Data: i64s(m.Seqs)},
		{Name: "q_len", DType: "I32", Shape: []int{B}, Data: i32s(m.QLen)},
		{Name: "kv_len", DType: "I32", Shape: []int{B}, Data: i32s(m.KVLen)},
		{Name: "cached", DType: "I32", Shape: []int{B}, Data: i32s(m.Cached)},
		{Name: "cu_q_seqlens", DType: "I32", Shape: []int{B + 1}, Data: i32s(m.CuQ)},
		{Name: "cu_kv_seqlens", DType: "I32", Shape: []int{B + 1}, Data: i32s(m.CuKV)},
		{Name: "cu_q_rows", DType: "I32", Shape: []int{B + 1}, Data: i32s(m.CuQRows)},
		{Name: "block_tables", DType: "I32", Shape: []int{B, m.MaxPages}, Data: i32s(m.BlockTables)},
		{Name: "scheduler_tile_counter", DType: "I32", Shape: []int{1}, Data: i32s([]int32{int32(sched.TileCounter)})},
		{Name: "scheduler_bmm1", DType: "F32", Shape: []int{2}, Data: numerics.F32Bytes(sched.BMM1[:])},
		{Name: "scheduler_bmm2", DType: "F32", Shape: []int{1}, Data: numerics.F32Bytes([]float32{sched.BMM2})},
		{Name: "q_out", DType: qType, Shape: []int{m.PaddedTokens, heads, numerics.HeadDim}, Data: qOut},
		{Name: "cache_page_ids", DType: "I32", Shape: []int{len(pages)}, Data: i32s(pages)},
		{Name: "cache_pages", DType: "U8", Shape: []int{len(pages), cfg.Cache.PageBytes()}, Data: pageBytes},
	}
	counts := make([]int32, B) // tokens each sequence keeps of this iteration
	for b, seq := range m.Seqs {
		counts[b] = m.QLen[b]
		if n, ok := accepted[seq]; ok {
			counts[b] = int32(n)
		}
	}
	tensors = append(tensors, safetensors.Tensor{Name: "accepted", DType: "I32", Shape: []int{B}, Data: i32s(counts)})
	comp, compMeta, err := compressorTensors(e, it, layer)
	if err != nil {
		return "", err
	}
	tensors = append(tensors, comp...)
	if cfg.Input == engine.InputHidden {
		chain, err := chainTensors(it, cfg.Model.HiddenSize, cfg.Model.QLoraRank)
		if err != nil {
			return "", err
		}
		tensors = append(tensors, chain...)
	}
	f32 := func(v float32) string { return strconv.FormatFloat(float64(v), 'g', -1, 32) }
	meta := map[string]string{
		"producer":        "github.com/dsv4mla/prologue/cmd/decode",
		"model":           cfg.Model.Name,
		"backend":         e.Backend().Name(),
		"iteration":       strconv.Itoa(it.Index()),
		"trace_line":      strconv.Itoa(line),
		"layer":           strconv.Itoa(layer),
		"rope_kind":       table.Kind.String(),
		"rope_mode":       table.Mode.String(),
		"heads":           strconv.Itoa(heads),
		"q_lora_rank":     strconv.Itoa(cfg.Model.QLoraRank),
		"rms_norm_eps":    f32(float32(cfg.Model.RMSNormEps)),
		"q_format":        cfg.QFormat.String(),
		"q_scale":         f32(cfg.QScale),
		"cache_format":    cfg.Cache.Format.String(),
		"page_size":       strconv.Itoa(cfg.Cache.PageSize),
		"page_bytes":      strconv.Itoa(cfg.Cache.PageBytes()),
		"num_pages":       strconv.Itoa(cfg.Cache.NumPages),
		"kv_scale":        f32(cfg.Cache.KVScale),
		"tokens":          strconv.Itoa(T),
		"padded_tokens":   strconv.Itoa(m.PaddedTokens),
		"ctx_tokens":      strconv.Itoa(m.CtxTokens),
		"gen_tokens":      strconv.Itoa(m.GenTokens),
		"num_ctx":         strconv.Itoa(m.NumCtx),
		"num_gen":         strconv.Itoa(m.NumGen),
		"gen_seq_len":     strconv.Itoa(m.GenSeqLen),
		"activation_seed": strconv.FormatUint(r.opts.Seed, 10),
		"input":           cfg.Input.String(),
		"head_begin":      strconv.Itoa(cfg.HeadBegin),
		"head_end":        strconv.Itoa(cfg.HeadEnd),
		"window":          strconv.Itoa(cfg.Cache.Window),
		"accept":          acceptList(m.Seqs, accepted),
	}
	for k, v := range compMeta {
		meta[k] = v
	}
	if cfg.Input == engine.InputHidden {
		meta["hidden_size"] = strconv.Itoa(cfg.Model.HiddenSize)
		if cfg.Checkpoint != "" {
			meta["checkpoint"] = cfg.Checkpoint
		}
	}
	if cfg.SyntheticWeights != nil {
		meta["weight_seed"] = strconv.FormatUint(cfg.SyntheticWeights.Seed, 10)
	}
	path := filepath.Join(r.opts.DumpDir, DumpFileName(it.Index(), layer))
	if err := safetensors.WriteFile(path, tensors, meta); err != nil {
		return "", fmt.Errorf("dump %s: %w", path, err)
	}
	return path, nil
}

// chainTensors are the hidden-state chain's buffers of a layer (the README
// lists them under "cmd/decode dump tensors").
func chainTensors(it *engine.Iteration, hidden, qLora int) ([]safetensors.Tensor, error) {
	T := it.Tokens()
	specs := []struct {
		t     engine.ChainTensor
		dtype string
		shape []int
	}{
		{engine.TensorHidden, "BF16", []int{T, hidden}},
		{engine.TensorHiddenFP8, "F8_E4M3", []int{T, hidden}},
		{engine.TensorHiddenScale, "F32", []int{hidden / numerics.ActQuantBlockSize, T}},
		{engine.TensorFusedA, "BF16", []int{T, qLora + numerics.HeadDim}},
		{engine.TensorQNormFP8, "F8_E4M3", []int{T, qLora}},
		{engine.TensorQNormScale, "F32", []int{qLora / numerics.ActQuantBlockSize, T}},
	}
	var out []safetensors.Tensor
	for _, s := range specs {
		data, err := it.Debug().ReadChain(s.t)
		if err != nil {
			return nil, err
		}
		out = append(out, safetensors.Tensor{Name: s.t.String(), DType: s.dtype, Shape: s.shape, Data: data})
	}
	return out, nil
}

// acceptList is the line's accept list as the metadata records it: "all",
// or seq:accepted for every sequence it names, in batch order.
func acceptList(seqs []uint64, accepted map[uint64]int) string {
	if accepted == nil {
		return "all"
	}
	var parts []string
	for _, seq := range seqs {
		if n, ok := accepted[seq]; ok {
			parts = append(parts, fmt.Sprintf("%d:%d", seq, n))
		}
	}
	return strings.Join(parts, ",")
}

// compressorTensors are a compressed layer's part of the cache model in
// the open iteration (none for a layer without a compressor): the entries
// it wrote (comp_entries: batch index, entry index, page; entry i of a
// sequence is written when the iteration's tokens reach (i+1)*ratio), the
// pages holding them (comp_page_ids, comp_pages, in the fp8_ue8m0 layout
// of CompressedPageSize entries), the ratio's block tables by entry index
// (comp_block_tables, -1 past a row's end), each sequence's state slot as
// the layer left it (comp_states: mla.RingRows rows of K then G, Width
// float32 each) and the entry norm weight (comp_norm).
func compressorTensors(e *engine.Engine, it *engine.Iteration, layer int) ([]safetensors.Tensor, map[string]string, error) {
	ratio, width := e.CompressRatio(layer), e.CompressorWidth(layer)
	if ratio == 0 {
		return nil, nil, nil
	}
	cfg := e.Config()
	m := it.Metadata()
	B := m.NumSeqs
	tables, err := it.Debug().CompressedBlockTables(ratio)
	if err != nil {
		return nil, nil, err
	}
	cols := 1
	for _, row := range tables {
		cols = max(cols, len(row))
	}
	flat := slices.Repeat([]int32{-1}, B*cols)
	var entries, pages []int32
	for b, row := range tables {
		copy(flat[b*cols:], row)
		for i := int(m.Cached[b]) / ratio; i < int(m.KVLen[b])/ratio; i++ {
			page := row[i/engine.CompressedPageSize]
			entries = append(entries, int32(b), int32(i), page)
			pages = append(pages, page)
		}
	}
	slices.Sort(pages)
	pages = slices.Compact(pages)
	pool, err := e.Debug().ReadCompressedPool(layer)
	if err != nil {
		return nil, nil, err
	}
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(engine.CompressedPageSize)
	var pageData []byte
	for _, p := range pages {
		pageData = append(pageData, pool[int(p)*pageBytes:(int(p)+1)*pageBytes]...)
	}
	rows := mla.RingRows(ratio, cfg.Compressor.MaxDrafts)
	var states []byte
	for _, seq := range m.Seqs {
		st, err := it.Debug().ReadCompressorSlot(layer, seq)
		if err != nil {
			return nil, nil, err
		}
		states = append(states, st...)
	}
	norm, err := e.Debug().CompressorNorm(layer)
	if err != nil {
		return nil, nil, err
	}
	tensors := []safetensors.Tensor{
		{Name: "comp_entries", DType: "I32", Shape: []int{len(entries) / 3, 3}, Data: i32s(entries)},
		{Name: "comp_page_ids", DType: "I32", Shape: []int{len(pages)}, Data: i32s(pages)},
		{Name: "comp_pages", DType: "U8", Shape: []int{len(pages), pageBytes}, Data: pageData},
		{Name: "comp_block_tables", DType: "I32", Shape: []int{B, cols}, Data: i32s(flat)},
		{Name: "comp_states", DType: "F32", Shape: []int{B, rows, 2, width}, Data: states},
		{Name: "comp_norm", DType: "F32", Shape: []int{numerics.HeadDim}, Data: numerics.F32Bytes(norm)},
	}
	if e.RunsIndexer(layer) {
		idx, err := indexerTensors(e, it, layer, pages, rows)
		if err != nil {
			return nil, nil, err
		}
		tensors = append(tensors, idx...)
	}
	meta := map[string]string{
		"compress_ratio":       strconv.Itoa(ratio),
		"compressed_page_size": strconv.Itoa(engine.CompressedPageSize),
		"max_drafts":           strconv.Itoa(cfg.Compressor.MaxDrafts),
		"state_rows":           strconv.Itoa(rows),
		"compressor_width":     strconv.Itoa(width),
	}
	return tensors, meta, nil
}

// indexerTensors are a ratio-4 layer's indexer outputs (DESIGN.md section
// 9): the query [T][64][68] bytes and head weights [T][64] bf16 of the
// iteration's tokens (in the fp8 query format [T][64][128] e4m3 bytes and
// float32 weights), the indexer cache's pages of the ratio-4 page ids the
// iteration wrote (pages, as comp_page_ids), the indexer states of the
// batch's sequences, and the top-k selection's indices [T][index_topk]
// int32 (ascending entry indices, then -1; none in the fp8 format, where
// the engine selects nothing).
func indexerTensors(e *engine.Engine, it *engine.Iteration, layer int, pages []int32, rows int) ([]safetensors.Tensor, error) {
	m := it.Metadata()
	q, w, err := it.Debug().ReadIndexerQuery()
	if err != nil {
		return nil, err
	}
	cache, err := e.Debug().ReadIndexerCache(layer)
	if err != nil {
		return nil, err
	}
	pb := engine.CompressedPageSize * mla.IndexerEntryBytes
	var pageData []byte
	for _, p := range pages {
		pageData = append(pageData, cache[int(p)*pb:(int(p)+1)*pb]...)
	}
	var states []byte
	for _, seq := range m.Seqs {
		st, err := it.Debug().ReadIndexerSlot(layer, seq)
		if err != nil {
			return nil, err
		}
		states = append(states, st...)
	}
	T := m.Tokens
	f := e.Config().Compressor.IndexerQueryFormat
	wtype := "BF16"
	if f == mla.IndexerQueryFP8 {
		wtype = "F32"
	}
	out := []safetensors.Tensor{
		{Name: "indexer_query", DType: "U8", Shape: []int{T, mla.IndexerHeads, f.RowBytes()}, Data: q},
		{Name: "indexer_weights", DType: wtype, Shape: []int{T, mla.IndexerHeads}, Data: w},
		{Name: "indexer_pages", DType: "U8", Shape: []int{len(pages), pb}, Data: pageData},
		{Name: "indexer_states", DType: "F32", Shape: []int{m.NumSeqs, rows, 2, 2 * mla.IndexerDim}, Data: states},
	}
	if e.IndexerTopK(layer) == nil { // the fp8 query format: no selection
		return out, nil
	}
	topk, err := it.Debug().ReadIndexerTopK(layer)
	if err != nil {
		return nil, err
	}
	return append(out, safetensors.Tensor{Name: "indexer_topk", DType: "I32", Shape: []int{T, e.IndexTopK()}, Data: i32s(topk)}), nil
}
