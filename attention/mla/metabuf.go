package mla

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"

	"github.com/dsv4mla/prologue/metadata"
)

// Header fields of the metadata buffer, int32 each, in this order (the
// kernels read them by these indices: kernels/cuda/abi).
const (
	HdrNumSeqs = iota
	HdrNumCtx
	HdrNumGen
	HdrCtxTokens
	HdrGenTokens
	HdrTokens
	HdrPaddedTokens
	HdrGenSeqLen
	HdrMaxPages
	// NumHdrFields is the header's length in int32s.
	NumHdrFields
)

// MetadataBuffers is the fixed-address device copy of one iteration's
// metadata, written once per iteration and read by every layer. All arrays
// live in one backend buffer at 16-byte aligned offsets so a single copy
// uploads them; the block tables use a fixed row stride (PageStride) so a
// captured graph's arguments never change.
type MetadataBuffers struct {
	Buf        Buffer
	MaxSeqs    int // capacity in sequences
	PageStride int // block-table row stride in entries (capacity in pages)

	// Byte offsets into Buf.
	OffHeader, OffCuQ, OffCuKV, OffCuQRows, OffQLen, OffKVLen, OffCached, OffBlockTables, OffScheduler int
	Size                                                                                               int
}

// SchedulerBytes is the size of the scheduler region: tile counter (uint32),
// bmm1[2] and bmm2 (float32).
const SchedulerBytes = 16

// Indices of the scheduler region's 32-bit words.
const (
	SchedTileCounter = 0
	SchedBMM1        = 1 // two words: bmm1[0], bmm1[1]
	SchedBMM2        = 3
)

func align16(n int) int { return (n + 15) &^ 15 }

// MaxMetadataBytes bounds the metadata buffer: its offsets are int32 on the
// device.
const MaxMetadataBytes = math.MaxInt32

// MetadataLayout computes the offsets for a capacity without allocating. A
// capacity whose buffer would pass MaxMetadataBytes is an error, so no size
// computed here overflows.
func MetadataLayout(maxSeqs, pageStride int) (*MetadataBuffers, error) {
	if maxSeqs <= 0 || pageStride <= 0 {
		return nil, fmt.Errorf("mla: metadata capacity maxSeqs=%d pageStride=%d, both must be > 0", maxSeqs, pageStride)
	}
	// Each sequence takes 7 int32 (3 prefix sums, 3 lengths, plus the sums'
	// extra entry, counted here per sequence) and a block-table row; 256
	// bytes cover the header, the scheduler and the alignment padding.
	if hi, lo := bits.Mul64(uint64(maxSeqs), uint64(pageStride)+7); hi != 0 || lo > (MaxMetadataBytes-256)/4 {
		return nil, fmt.Errorf("mla: metadata capacity maxSeqs=%d pageStride=%d: the buffer would pass %d bytes", maxSeqs, pageStride, MaxMetadataBytes)
	}
	mb := &MetadataBuffers{MaxSeqs: maxSeqs, PageStride: pageStride}
	off := 0
	next := func(n int) int { o := off; off = align16(off + n); return o }
	mb.OffHeader = next(NumHdrFields * 4)
	mb.OffCuQ = next((maxSeqs + 1) * 4)
	mb.OffCuKV = next((maxSeqs + 1) * 4)
	mb.OffCuQRows = next((maxSeqs + 1) * 4)
	mb.OffQLen = next(maxSeqs * 4)
	mb.OffKVLen = next(maxSeqs * 4)
	mb.OffCached = next(maxSeqs * 4)
	mb.OffBlockTables = next(maxSeqs * pageStride * 4)
	mb.OffScheduler = next(SchedulerBytes)
	mb.Size = off
	return mb, nil
}

// NewMetadataBuffers allocates the buffer on b.
func NewMetadataBuffers(b Backend, maxSeqs, pageStride int) (*MetadataBuffers, error) {
	mb, err := MetadataLayout(maxSeqs, pageStride)
	if err != nil {
		return nil, err
	}
	if mb.Buf, err = b.Alloc(mb.Size); err != nil {
		return nil, fmt.Errorf("mla: metadata buffer of %d bytes: %w", mb.Size, err)
	}
	// Poison the scheduler region so a kernel that fails to write it shows.
	if err := b.Fill(mb.Buf, 0, mb.Size, 0xFF); err != nil {
		return nil, err
	}
	return mb, nil
}

// Encode lays m out as the buffer's bytes (everything but the scheduler
// region, which the first KV launch writes). It refuses a batch that does
// not fit the capacity and a block-table entry outside the pool: a slot
// outside the pool is an error, never a write.
func (mb *MetadataBuffers) Encode(m *metadata.Metadata, numPages int) ([]byte, error) {
	if m.NumSeqs > mb.MaxSeqs {
		return nil, fmt.Errorf("mla: batch of %d sequences exceeds the metadata capacity of %d", m.NumSeqs, mb.MaxSeqs)
	}
	if m.MaxPages > mb.PageStride {
		return nil, fmt.Errorf("mla: block tables %d pages wide exceed the metadata capacity of %d", m.MaxPages, mb.PageStride)
	}
	out := make([]byte, mb.OffScheduler)
	put := func(off, i int, v int32) { binary.LittleEndian.PutUint32(out[off+4*i:], uint32(v)) }
	hdr := [NumHdrFields]int{m.NumSeqs, m.NumCtx, m.NumGen, m.CtxTokens, m.GenTokens, m.Tokens, m.PaddedTokens, m.GenSeqLen, m.MaxPages}
	for i, v := range hdr {
		if v > math.MaxInt32 {
			return nil, fmt.Errorf("mla: metadata header field %d = %d overflows int32", i, v)
		}
		put(mb.OffHeader, i, int32(v))
	}
	for i := 0; i <= m.NumSeqs; i++ {
		put(mb.OffCuQ, i, m.CuQ[i])
		put(mb.OffCuKV, i, m.CuKV[i])
		put(mb.OffCuQRows, i, m.CuQRows[i])
	}
	for b := 0; b < m.NumSeqs; b++ {
		put(mb.OffQLen, b, m.QLen[b])
		put(mb.OffKVLen, b, m.KVLen[b])
		put(mb.OffCached, b, m.Cached[b])
		for p := 0; p < mb.PageStride; p++ {
			page := int32(-1)
			if p < m.MaxPages {
				page = m.BlockTables[b*m.MaxPages+p]
			}
			if int(page) >= numPages {
				return nil, fmt.Errorf("mla: sequence %d block table entry %d = page %d, outside the pool of %d pages", m.Seqs[b], p, page, numPages)
			}
			put(mb.OffBlockTables, b*mb.PageStride+p, page)
		}
	}
	return out, nil
}

// Upload encodes m and writes it with one copy.
func (mb *MetadataBuffers) Upload(b Backend, m *metadata.Metadata, numPages int) error {
	enc, err := mb.Encode(m, numPages)
	if err != nil {
		return err
	}
	return b.Write(mb.Buf, 0, enc)
}

// DecodeScheduler reads the scheduler region's bytes.
func DecodeScheduler(p []byte) metadata.SchedulerScalars {
	return metadata.SchedulerScalars{
		TileCounter: binary.LittleEndian.Uint32(p[4*SchedTileCounter:]),
		BMM1: [2]float32{
			math.Float32frombits(binary.LittleEndian.Uint32(p[4*SchedBMM1:])),
			math.Float32frombits(binary.LittleEndian.Uint32(p[4*SchedBMM1+4:])),
		},
		BMM2: math.Float32frombits(binary.LittleEndian.Uint32(p[4*SchedBMM2:])),
	}
}

// EncodeScheduler is the inverse of DecodeScheduler.
func EncodeScheduler(s metadata.SchedulerScalars) []byte {
	p := make([]byte, SchedulerBytes)
	binary.LittleEndian.PutUint32(p[4*SchedTileCounter:], s.TileCounter)
	binary.LittleEndian.PutUint32(p[4*SchedBMM1:], math.Float32bits(s.BMM1[0]))
	binary.LittleEndian.PutUint32(p[4*SchedBMM1+4:], math.Float32bits(s.BMM1[1]))
	binary.LittleEndian.PutUint32(p[4*SchedBMM2:], math.Float32bits(s.BMM2))
	return p
}

// ReadScheduler reads back the scheduler scalars the last layer wrote.
func (mb *MetadataBuffers) ReadScheduler(b Backend) (metadata.SchedulerScalars, error) {
	p := make([]byte, SchedulerBytes)
	if err := b.Read(p, mb.Buf, mb.OffScheduler); err != nil {
		return metadata.SchedulerScalars{}, err
	}
	return DecodeScheduler(p), nil
}
