package mla

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

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

	mirror metaMirror // Upload's host copy of what the device holds
}

// metaMirror is the host copy of the buffer's bytes [0, OffScheduler) as
// the last Upload left them on the device, so that the next Upload copies
// only the words that changed (one copy of the span that covers them)
// instead of encoding and copying every block-table row at its full
// stride. Between decode iterations only the lengths, prefix sums and the
// few rows that gained a page change.
//
// On a backend that is an AsyncWriter the words are its staging memory and
// the span is copied straight from them without waiting for the copy: the
// words must then not change until the copy has read them, so Upload calls
// WaitWrites before it touches them (free when the iteration's end has
// waited for the device since, as the engine's End and Abort do).
type metaMirror struct {
	words    []int32 // [OffScheduler/4], the device's int32 words
	wordsOf  Backend // the AsyncWriter whose staging memory words is; nil: Go memory
	buf      Buffer  // the buffer the words mirror; nil: nothing mirrored
	backend  Backend
	numPages int     // the pool bound every mirrored page passed
	seqs     int     // sequences of the last upload: entries past them are 0
	width    int     // the block-table rows' width: entries at or past it are -1 (rows < seqs)
	changed  []int32 // the rows below seqs that check found to differ, ascending
	lo, hi   int     // the words this upload changed, [lo, hi)
	// build is the metadata.RowKeeper build whose block-table rows the
	// words hold (0: none known): UploadKeeping skips the rows a later
	// build kept from it.
	build uint64
}

// Invalidate forgets what Upload last wrote, so the next Upload writes
// every byte. Call it after writing the buffer's metadata region other
// than through Upload.
func (mb *MetadataBuffers) Invalidate() { mb.mirror.buf = nil }

// nativeLittleEndian: the mirror's int32 words are the device's bytes as
// they are, with no encoding pass.
var nativeLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

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

// Upload writes the bytes Encode lays out for m with one copy. After a
// first full copy it copies only the span of words that differ from what
// its last upload left in the same buffer (the device bytes end up the
// same either way); nothing is copied when nothing changed. A refused m
// (see Encode) writes nothing and leaves the mirror as it was.
//
// On an AsyncWriter backend the copy is enqueued without waiting for it:
// the launches issued after Upload read the new bytes (they are ordered
// after the copy on the device), and Upload itself waits, before it
// rewrites its staging words, for the copy of the previous Upload when
// nothing has waited for it since.
func (mb *MetadataBuffers) Upload(b Backend, m *metadata.Metadata, numPages int) error {
	return mb.UploadKeeping(b, m, numPages, nil)
}

// UploadKeeping is Upload for m built by metadata.Plan.BuildKeeping with k:
// when the mirror holds the rows of the build k's last one kept rows from,
// it neither compares nor copies the kept rows (they are the same words).
// The device bytes are the same as Upload's.
func (mb *MetadataBuffers) UploadKeeping(b Backend, m *metadata.Metadata, numPages int, k *metadata.RowKeeper) error {
	var build uint64
	var rebuilt []int32 // nil: compare every row
	if k != nil {
		var from uint64
		var rows int
		build, from, rows, rebuilt = k.Kept()
		if from == 0 || from != mb.mirror.build || rows != m.NumSeqs {
			rebuilt = nil
		} else if rebuilt == nil {
			rebuilt = []int32{} // every row kept
		}
	}
	mm := &mb.mirror
	aw, async := b.(AsyncWriter)
	if async && mm.wordsOf == b {
		// The words may still feed the last upload's copy. This also
		// refuses a closed backend, whose staging memory is gone, before
		// check reads the words.
		if err := aw.WaitWrites(wordBytes(mm.words)); err != nil {
			return err
		}
	}
	if !nativeLittleEndian || mm.buf == nil || mm.buf != mb.Buf || mm.backend != b || mm.numPages != numPages {
		if err := mb.uploadAll(b, m, numPages); err != nil {
			return err
		}
		mm.build = build
		return nil
	}
	if err := mb.check(m, numPages, rebuilt); err != nil {
		return err
	}
	mb.update(m)
	mm.build = build
	if mm.lo >= mm.hi {
		return nil
	}
	src := wordBytes(mm.words[mm.lo:mm.hi])
	var err error
	if async {
		err = aw.WriteAsync(mb.Buf, 4*mm.lo, src)
	} else {
		err = b.Write(mb.Buf, 4*mm.lo, src)
	}
	if err != nil {
		mm.buf, mm.build = nil, 0 // the device holds an unknown mix: write it all next time
		return err
	}
	return nil
}

// uploadAll is Upload's full copy: the whole encoding, which the mirror
// then holds.
func (mb *MetadataBuffers) uploadAll(b Backend, m *metadata.Metadata, numPages int) error {
	enc, err := mb.Encode(m, numPages)
	if err != nil {
		return err
	}
	mm := &mb.mirror
	mm.buf, mm.build = nil, 0
	if !nativeLittleEndian {
		return b.Write(mb.Buf, 0, enc)
	}
	if err := mb.allocWords(b); err != nil {
		return err
	}
	copy(wordBytes(mm.words), enc)
	if aw, ok := mm.wordsOf.(AsyncWriter); ok {
		err = aw.WriteAsync(mb.Buf, 0, wordBytes(mm.words))
	} else {
		err = b.Write(mb.Buf, 0, enc)
	}
	if err != nil {
		return err
	}
	mb.remember(b, m, numPages)
	return nil
}

// allocWords gives the mirror its words and row state for b: b's staging
// memory when b is an AsyncWriter, else Go memory. Words b already owns
// are kept (Upload waited for their last copy).
func (mb *MetadataBuffers) allocWords(b Backend) error {
	mm := &mb.mirror
	n := mb.OffScheduler / 4
	if cap(mm.changed) < mb.MaxSeqs {
		mm.changed = make([]int32, 0, mb.MaxSeqs)
	}
	aw, async := b.(AsyncWriter)
	if len(mm.words) == n && ((async && mm.wordsOf == b) || (!async && mm.wordsOf == nil)) {
		return nil
	}
	mm.words, mm.wordsOf = nil, nil
	if !async {
		mm.words = make([]int32, n)
		return nil
	}
	raw, err := aw.AllocStaging(4 * n)
	if err != nil {
		return fmt.Errorf("mla: metadata staging memory of %d bytes: %w", 4*n, err)
	}
	if len(raw) != 4*n || uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%4 != 0 {
		return fmt.Errorf("mla: %s staging memory: got %d bytes, want %d 4-byte aligned", b.Name(), len(raw), 4*n)
	}
	mm.words = unsafe.Slice((*int32)(unsafe.Pointer(unsafe.SliceData(raw))), n)
	mm.wordsOf = b
	return nil
}

// wordBytes views int32 words as their native (little-endian) bytes.
func wordBytes(w []int32) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w))
}

// remember records that the mirror's words, just uploaded in full, are m's
// encoding.
func (mb *MetadataBuffers) remember(b Backend, m *metadata.Metadata, numPages int) {
	mm := &mb.mirror
	mm.buf, mm.backend, mm.numPages, mm.seqs, mm.width = mb.Buf, b, numPages, m.NumSeqs, m.MaxPages
}

// check refuses what Encode refuses, except the page bound of block-table
// entries, which it checks only on the rows that change (the others passed
// it on an earlier upload with the same pool); it lists those rows for
// update. A non-nil rebuilt (UploadKeeping) lists, ascending, the only
// rows that may differ from the mirror's: the others are not compared.
func (mb *MetadataBuffers) check(m *metadata.Metadata, numPages int, rebuilt []int32) error {
	if m.NumSeqs > mb.MaxSeqs {
		return fmt.Errorf("mla: batch of %d sequences exceeds the metadata capacity of %d", m.NumSeqs, mb.MaxSeqs)
	}
	if m.MaxPages > mb.PageStride {
		return fmt.Errorf("mla: block tables %d pages wide exceed the metadata capacity of %d", m.MaxPages, mb.PageStride)
	}
	hdr := [NumHdrFields]int{m.NumSeqs, m.NumCtx, m.NumGen, m.CtxTokens, m.GenTokens, m.Tokens, m.PaddedTokens, m.GenSeqLen, m.MaxPages}
	for i, v := range hdr {
		if v > math.MaxInt32 {
			return fmt.Errorf("mla: metadata header field %d = %d overflows int32", i, v)
		}
	}
	mm := &mb.mirror
	mm.changed = mm.changed[:0]
	if mm.width != m.MaxPages {
		rebuilt = nil // the kept rows' entries past the narrower width change
	}
	// Rows from mm.seqs on were all zeros: update writes them whole.
	mirrored := min(m.NumSeqs, mm.seqs)
	compare := func(r int) error {
		row := m.BlockTables[r*m.MaxPages : (r+1)*m.MaxPages]
		if equalWords(row, mm.words[mb.OffBlockTables/4+r*mb.PageStride:][:m.MaxPages]) {
			return nil
		}
		if err := checkPages(m, r, row, numPages); err != nil {
			return err
		}
		mm.changed = append(mm.changed, int32(r))
		return nil
	}
	if rebuilt != nil {
		for _, r := range rebuilt {
			if int(r) >= mirrored {
				break
			}
			if err := compare(int(r)); err != nil {
				return err
			}
		}
	} else {
		for r := range mirrored {
			if err := compare(r); err != nil {
				return err
			}
		}
	}
	for r := mm.seqs; r < m.NumSeqs; r++ {
		if err := checkPages(m, r, m.BlockTables[r*m.MaxPages:(r+1)*m.MaxPages], numPages); err != nil {
			return err
		}
	}
	return nil
}

// checkPages refuses a block-table row (row r of m) with a page outside the
// pool.
func checkPages(m *metadata.Metadata, r int, row []int32, numPages int) error {
	largest := int32(-1) // one pass without branches; the entry only on a refusal
	for _, page := range row {
		largest = max(largest, page)
	}
	if int(largest) < numPages {
		return nil
	}
	for p, page := range row {
		if int(page) >= numPages {
			return fmt.Errorf("mla: sequence %d block table entry %d = page %d, outside the pool of %d pages", m.Seqs[r], p, page, numPages)
		}
	}
	return nil
}

func equalWords(a, b []int32) bool { return string(wordBytes(a)) == string(wordBytes(b)) }

// update writes m's encoding into the mirror, recording the span of words
// that changed in [lo, hi). check has listed the block-table rows that
// changed.
func (mb *MetadataBuffers) update(m *metadata.Metadata) {
	mm := &mb.mirror
	mm.lo, mm.hi = len(mm.words), 0
	hdr := [NumHdrFields]int32{int32(m.NumSeqs), int32(m.NumCtx), int32(m.NumGen), int32(m.CtxTokens), int32(m.GenTokens),
		int32(m.Tokens), int32(m.PaddedTokens), int32(m.GenSeqLen), int32(m.MaxPages)} // check bounded them
	mm.put(mb.OffHeader/4, hdr[:])
	// Entries past the batch are 0, as Encode leaves them: clear those the
	// last upload used.
	n, old := m.NumSeqs, mm.seqs
	for _, a := range [...]struct {
		off  int
		vals []int32
	}{{mb.OffCuQ, m.CuQ[:n+1]}, {mb.OffCuKV, m.CuKV[:n+1]}, {mb.OffCuQRows, m.CuQRows[:n+1]}} {
		mm.put(a.off/4, a.vals)
		mm.fill(a.off/4+n+1, old-n, 0)
	}
	for _, a := range [...]struct {
		off  int
		vals []int32
	}{{mb.OffQLen, m.QLen[:n]}, {mb.OffKVLen, m.KVLen[:n]}, {mb.OffCached, m.Cached[:n]}} {
		mm.put(a.off/4, a.vals)
		mm.fill(a.off/4+n, old-n, 0)
	}
	w := m.MaxPages
	row := func(r int) (base int, vals []int32) {
		return mb.OffBlockTables/4 + r*mb.PageStride, m.BlockTables[r*w : (r+1)*w]
	}
	for _, r := range mm.changed {
		base, vals := row(int(r))
		mm.put(base, vals)
	}
	if mm.width > w {
		// Entries past both widths are -1 already.
		for r := range min(n, old) {
			base, _ := row(r)
			mm.fill(base+w, mm.width-w, -1)
		}
	}
	for r := old; r < n; r++ {
		// A row that was all zeros: every entry changes.
		base, vals := row(r)
		mm.put(base, vals)
		mm.fill(base+w, mb.PageStride-w, -1)
	}
	for r := n; r < old; r++ {
		mm.fill(mb.OffBlockTables/4+r*mb.PageStride, mb.PageStride, 0)
	}
	mm.seqs, mm.width = n, w
}

// put sets the words from off on to vals, widening [lo, hi) to cover the
// ones that changed: the first and the last that differ, and the copy
// between them.
func (mm *metaMirror) put(off int, vals []int32) {
	dst := mm.words[off : off+len(vals)]
	if equalWords(dst, vals) {
		return
	}
	i := leadingEqual(dst, vals)
	j := len(vals) - trailingEqual(dst[i:], vals[i:]) // > i: word i differs
	copy(dst[i:j], vals[i:j])
	mm.lo, mm.hi = min(mm.lo, off+i), max(mm.hi, off+j)
}

// wordRun is the number of words leadingEqual and trailingEqual compare at
// once (as strings: the runtime's vectorized compare).
const wordRun = 32

// leadingEqual is the length of the longest common prefix of a and b
// (len(a) == len(b)).
func leadingEqual(a, b []int32) int {
	i := 0
	for i+wordRun <= len(a) && equalWords(a[i:i+wordRun], b[i:i+wordRun]) {
		i += wordRun
	}
	for i < len(a) && a[i] == b[i] {
		i++
	}
	return i
}

// trailingEqual is the length of the longest common suffix of a and b
// (len(a) == len(b)).
func trailingEqual(a, b []int32) int {
	j := len(a)
	for j >= wordRun && equalWords(a[j-wordRun:j], b[j-wordRun:j]) {
		j -= wordRun
	}
	for j > 0 && a[j-1] == b[j-1] {
		j--
	}
	return len(a) - j
}

// fill sets n words from off on to v (nothing for n <= 0), widening [lo,
// hi) as put does.
func (mm *metaMirror) fill(off, n int, v int32) {
	if n <= 0 {
		return
	}
	dst := mm.words[off : off+n]
	i := 0
	for i < n && dst[i] == v {
		i++
	}
	if i == n {
		return
	}
	j := n
	for dst[j-1] == v {
		j--
	}
	for k := i; k < j; k++ {
		dst[k] = v
	}
	mm.lo, mm.hi = min(mm.lo, off+i), max(mm.hi, off+j)
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
