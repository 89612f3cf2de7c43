package metadata

import "math/bits"

// Metadata is the per-iteration, layer-invariant description of a batch, in
// the layout of the fixed-address device buffers (docs/DESIGN.md section 5).
// Sequences are ordered context-first.
type Metadata struct {
	NumSeqs, NumCtx, NumGen int
	// CtxTokens and GenTokens are the real rows of each phase: context rows
	// are [0, CtxTokens), generation rows [CtxTokens, CtxTokens+GenTokens).
	CtxTokens, GenTokens int
	Tokens               int // CtxTokens + GenTokens
	PaddedTokens         int // >= Tokens; rows in [Tokens, PaddedTokens) are padding
	GenSeqLen            int // uniform generation q_len = 1 + MTP (0 when NumGen == 0)
	Heads                int // Q heads, the factor of CuQRows
	PageSize             int // KV cache page size in tokens, a power of two

	Seqs                []uint64 // [NumSeqs]
	QLen, KVLen, Cached []int32  // [NumSeqs]; Cached = KVLen - QLen
	CuQ, CuKV           []int32  // [NumSeqs+1], prefix sums of QLen and KVLen
	CuQRows             []int32  // [NumSeqs+1], prefix sums of QLen*Heads (FMHA Q rows)

	MaxPages int
	// BlockTables is [NumSeqs][MaxPages] row-major; entries past the pages
	// covering a sequence's KVLen are -1.
	BlockTables []int32

	Scheduler SchedulerScalars
}

// Row maps a token row to its batch index and position. ok is false for
// padding rows and rows outside [0, PaddedTokens).
//
// Context rows: b is the sequence whose [CuQ[b], CuQ[b+1]) holds t (binary
// search), pos = t - CuQ[b] + Cached[b]. Generation rows: g = (t -
// CtxTokens) / GenSeqLen, b = NumCtx + g, pos = KVLen[b] - GenSeqLen + (t -
// CtxTokens) % GenSeqLen.
func (m *Metadata) Row(t int) (b int, pos int, ok bool) {
	if t < 0 || t >= m.Tokens {
		return 0, 0, false
	}
	if t < m.CtxTokens {
		// Largest b in [0, NumCtx) with CuQ[b] <= t; every QLen >= 1, so it
		// is unique.
		lo, hi := 0, m.NumCtx-1
		for lo < hi {
			mid := int(uint(lo+hi+1) >> 1)
			if int(m.CuQ[mid]) <= t {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return lo, t - int(m.CuQ[lo]) + int(m.Cached[lo]), true
	}
	r := t - m.CtxTokens
	b = m.NumCtx + r/m.GenSeqLen
	return b, int(m.KVLen[b]) - m.GenSeqLen + r%m.GenSeqLen, true
}

// pageShift is log2(PageSize); it is derived, not stored, so a Metadata
// assembled field by field still maps slots correctly.
func (m *Metadata) pageShift() uint {
	return uint(bits.TrailingZeros(uint(m.PageSize)))
}

// slotOf is block_table[b][pos >> log2 P] * P + (pos & (P-1)).
func (m *Metadata) slotOf(b, pos int, shift uint) int64 {
	page := m.BlockTables[b*m.MaxPages+pos>>shift]
	return int64(page)<<shift | int64(pos&(m.PageSize-1))
}

// Slot returns the KV cache slot of token row t, or -1 for a padding row
// (and any row outside [0, PaddedTokens)).
func (m *Metadata) Slot(t int) int64 {
	b, pos, ok := m.Row(t)
	if !ok {
		return -1
	}
	return m.slotOf(b, pos, m.pageShift())
}

// Positions returns the RoPE position of every padded row. Padding rows get
// position 0, a valid table index, because kernels skip them anyway.
func (m *Metadata) Positions() []int32 {
	out := make([]int32, m.PaddedTokens)
	t := 0
	for b := range m.NumSeqs {
		for pos := m.Cached[b]; pos < m.KVLen[b]; pos++ {
			out[t] = pos
			t++
		}
	}
	return out
}

// Slots returns the KV cache slot of every padded row; padding rows get -1,
// which every store skips.
func (m *Metadata) Slots() []int64 {
	out := make([]int64, m.PaddedTokens)
	shift := m.pageShift()
	t := 0
	for b := range m.NumSeqs {
		for pos := int(m.Cached[b]); pos < int(m.KVLen[b]); pos++ {
			out[t] = m.slotOf(b, pos, shift)
			t++
		}
	}
	for ; t < len(out); t++ {
		out[t] = -1
	}
	return out
}
