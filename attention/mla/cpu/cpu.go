package cpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"runtime"

	"golang.org/x/sync/errgroup"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

const d = numerics.HeadDim

// Buffer is host memory.
type Buffer struct{ b []byte }

// Len is the buffer's size in bytes.
func (b *Buffer) Len() int { return len(b.b) }

// Bytes exposes the memory of a CPU buffer.
func Bytes(buf mla.Buffer) []byte { return buf.(*Buffer).b }

// Backend runs the prologue on the host's cores.
type Backend struct {
	workers int
	// rowsPerTask keeps a task large enough to amortize scheduling.
	rowsPerTask int
}

// New returns a CPU backend using workers goroutines (0: GOMAXPROCS).
func New(workers int) *Backend {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &Backend{workers: workers, rowsPerTask: 64}
}

// Name is "cpu".
func (*Backend) Name() string { return "cpu" }

// Alloc returns zeroed host memory.
func (*Backend) Alloc(n int) (mla.Buffer, error) {
	if n < 0 {
		return nil, fmt.Errorf("cpu: Alloc(%d): negative size", n)
	}
	return &Buffer{b: make([]byte, n)}, nil
}

// Free drops the buffer.
func (*Backend) Free(b mla.Buffer) error {
	if hb, ok := b.(*Buffer); ok {
		hb.b = nil
	}
	return nil
}

func span(buf mla.Buffer, off, n int) ([]byte, error) {
	hb, ok := buf.(*Buffer)
	if !ok {
		return nil, fmt.Errorf("cpu: buffer of type %T is not a CPU buffer", buf)
	}
	if off < 0 || n < 0 || off+n > len(hb.b) {
		return nil, fmt.Errorf("cpu: range [%d,%d) outside a buffer of %d bytes", off, off+n, len(hb.b))
	}
	return hb.b[off : off+n], nil
}

// Write copies src into dst at off.
func (*Backend) Write(dst mla.Buffer, off int, src []byte) error {
	s, err := span(dst, off, len(src))
	if err != nil {
		return err
	}
	copy(s, src)
	return nil
}

// Read copies from src at off into dst.
func (*Backend) Read(dst []byte, src mla.Buffer, off int) error {
	s, err := span(src, off, len(dst))
	if err != nil {
		return err
	}
	copy(dst, s)
	return nil
}

// Fill sets n bytes at off to v.
func (*Backend) Fill(dst mla.Buffer, off, n int, v byte) error {
	s, err := span(dst, off, n)
	if err != nil {
		return err
	}
	// Not byte stores: under -race each was a check, and the engine fills
	// every buffer it allocates (megabytes an engine). clear is not
	// instrumented, so its write is reported as one range; copy reports its
	// own.
	if v == 0 {
		clear(s)
		race.Write(s)
	} else if len(s) > 0 {
		s[0] = v
		for n := 1; n < len(s); n *= 2 {
			copy(s[n:], s[:n])
		}
	}
	return nil
}

// Synchronize is a no-op: CPU launches complete before they return.
func (*Backend) Synchronize(ctx context.Context) error { return ctx.Err() }

// Close releases nothing.
func (*Backend) Close() error { return nil }

// meta reads the encoded metadata buffer.
type meta struct {
	b  []byte
	mb *mla.MetadataBuffers
}

func (m meta) at(off, i int) int32 { return int32(binary.LittleEndian.Uint32(m.b[off+4*i:])) }

// withHeader replaces a FromHeader launch's counts with the header's, as
// the GPU kernels do.
func (m meta) withHeader(l mla.Launch) mla.Launch {
	if l.FromHeader {
		l.NumSeqs = int(m.at(m.mb.OffHeader, mla.HdrNumGen))
		l.ValidRows = int(m.at(m.mb.OffHeader, mla.HdrGenTokens))
		l.SeqLen = max(1, int(m.at(m.mb.OffHeader, mla.HdrGenSeqLen)))
	}
	return l
}

// rowPosition resolves a launch-local row to (batch index, position) as the
// GPU kernels do; ok is false for padding rows.
func (m meta) rowPosition(l mla.Launch, local int) (b, pos int, ok bool) {
	if local >= l.ValidRows {
		return 0, 0, false
	}
	t := int32(l.RowBegin + local)
	if l.Phase == metadata.Context {
		lo, hi := l.SeqBegin, l.SeqBegin+l.NumSeqs-1 // find the last b with cu_q[b] <= t
		for lo < hi {
			mid := (lo + hi + 1) / 2
			if m.at(m.mb.OffCuQ, mid) <= t {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		return lo, int(t-m.at(m.mb.OffCuQ, lo)) + int(m.at(m.mb.OffCached, lo)), true
	}
	g := local / l.SeqLen
	b = l.SeqBegin + g
	return b, int(m.at(m.mb.OffKVLen, b)) - l.SeqLen + local%l.SeqLen, true
}

// parallel runs f over [0, n) in chunks on the backend's workers.
func (c *Backend) parallel(ctx context.Context, n int, f func(i int)) error {
	chunk := max(c.rowsPerTask, (n+c.workers-1)/c.workers)
	var g errgroup.Group
	g.SetLimit(c.workers)
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		g.Go(func() error {
			if err := ctx.Err(); err != nil {
				return err
			}
			for i := lo; i < hi; i++ {
				f(i)
			}
			return nil
		})
	}
	return g.Wait()
}

// loadRow, ropeTail, normRopeRow and storeQ are the per-row loops of the
// two prologue kernels, left out of the race detector's per-element
// instrumentation: their callers report the rows they read and write as
// whole ranges (race.Read, race.Write), so a race on them is still seen.
//
//go:norace
//go:nocheckptr
func loadRow(x *[d]float32, src []byte) {
	for i := range x {
		x[i] = numerics.F32FromBF16(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

//go:norace
//go:nocheckptr
func ropeTail(y *[d]float32, rope []byte) {
	for k := 0; k < numerics.RopePairs; k++ {
		c := math.Float32frombits(binary.LittleEndian.Uint32(rope[8*k:]))
		s := math.Float32frombits(binary.LittleEndian.Uint32(rope[8*k+4:]))
		i := numerics.NopeDim + 2*k
		y[i], y[i+1] = numerics.Rope(y[i], y[i+1], c, s)
	}
}

// KVNormRopeStore implements mla.Backend.
func (c *Backend) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	m := meta{b: Bytes(a.Meta.Buf), mb: a.Meta}
	l = m.withHeader(l)
	if l.WriteScheduler {
		s := metadata.ComputeSchedulerScalars(a.Scheduler)
		copy(m.b[a.Meta.OffScheduler:], mla.EncodeScheduler(s))
	}
	latent, rope, cache := Bytes(a.Latent), Bytes(a.Rope), Bytes(a.Cache)
	var w [d]float32
	wb := Bytes(a.KVWeight)
	for i := range w {
		w[i] = math.Float32frombits(binary.LittleEndian.Uint32(wb[4*i:]))
	}
	cfg := a.CacheConfig
	pageBytes := cfg.Format.PageBytes(cfg.PageSize)
	log2P := bits.TrailingZeros(uint(cfg.PageSize))
	return c.parallel(ctx, l.Rows, func(local int) {
		b, pos, ok := m.rowPosition(l, local)
		if !ok || pos < 0 || pos >= a.RopePositions {
			return
		}
		page := m.at(a.Meta.OffBlockTables, b*a.Meta.PageStride+pos>>log2P)
		if page < 0 || int(page) >= cfg.NumPages {
			return
		}
		t := l.RowBegin + local
		var y [d]float32
		src, rp := latent[a.LatentOffset+t*a.LatentStride*2:][:2*d], rope[pos*numerics.RopeDim*4:][:numerics.RopeDim*4]
		race.Read(src)
		race.Read(rp)
		normRopeRow(&y, src, rp, &w, a.Eps)
		pg := cache[int(page)*pageBytes : (int(page)+1)*pageBytes]
		if err := kvcache.EncodeToken(cfg.Format, pg, cfg.PageSize, pos&(cfg.PageSize-1), &y, cfg.KVScale); err != nil {
			panic(err) // unreachable: LayerArgs.Validate checked the cache config, and page and offset are in range
		}
	})
}

// QNormRopeQuant implements mla.Backend.
func (c *Backend) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	m := meta{b: Bytes(a.Meta.Buf), mb: a.Meta}
	l = m.withHeader(l)
	qin, qout, rope := Bytes(a.QIn), Bytes(a.QOut), Bytes(a.Rope)
	es := a.QFormat.ElemBytes()
	rowOut := d * es
	return c.parallel(ctx, l.Rows*a.Heads, func(unit int) {
		local, h := unit/a.Heads, unit%a.Heads
		t := l.RowBegin + local
		out := qout[(t*a.Heads+h)*rowOut : (t*a.Heads+h+1)*rowOut]
		_, pos, ok := m.rowPosition(l, local)
		if !ok || pos < 0 || pos >= a.RopePositions {
			clear(out)
			return
		}
		var y [d]float32
		src, rp := qin[(t*a.Heads+h)*d*2:][:2*d], rope[pos*numerics.RopeDim*4:][:numerics.RopeDim*4]
		race.Read(src)
		race.Read(rp)
		normRopeRow(&y, src, rp, nil, a.Eps)
		race.Write(out)
		storeQ(out, &y, a.QFormat == mla.QBF16, a.QScale)
	})
}

// normRopeRow is a row's RMSNorm (times the weight w, nil for the Q
// heads', which have none), bf16 rounding and RoPE tail into y.
//
//go:norace
//go:nocheckptr
func normRopeRow(y *[d]float32, src, rope []byte, w *[d]float32, eps float32) {
	var x [d]float32
	loadRow(&x, src)
	r := numerics.RMSInv(numerics.SumSquares(x[:]), eps)
	if w != nil {
		for i := range y {
			y[i] = numerics.RoundBF16(float32(float32(x[i]*r) * w[i]))
		}
	} else {
		for i := range y {
			y[i] = numerics.RoundBF16(float32(x[i] * r))
		}
	}
	ropeTail(y, rope)
}

//go:norace
//go:nocheckptr
func storeQ(out []byte, y *[d]float32, bf16 bool, scale float32) {
	if bf16 {
		for i, v := range y {
			binary.LittleEndian.PutUint16(out[2*i:], numerics.BF16FromF32(v))
		}
		return
	}
	for i, v := range y {
		out[i] = numerics.E4M3FromF32(float32(v * scale))
	}
}
