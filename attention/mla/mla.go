package mla

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/numerics"
)

// Buffer is memory owned by a backend: host memory for the CPU backend,
// device memory for CUDA. Its address never changes while it lives, so a
// captured CUDA graph can keep reading it.
type Buffer interface {
	Len() int
}

// QFormat is the element type of the attention Q buffer.
type QFormat uint8

const (
	// QFP8 is e4m3 with one per-tensor scale.
	QFP8 QFormat = iota
	// QBF16 is bfloat16, unscaled.
	QBF16
)

// QFormats lists every Q format, in declaration order.
func QFormats() []QFormat { return []QFormat{QFP8, QBF16} }

func (f QFormat) String() string {
	switch f {
	case QFP8:
		return "fp8"
	case QBF16:
		return "bf16"
	}
	return fmt.Sprintf("QFormat(%d)", uint8(f))
}

// ParseQFormat is the inverse of QFormat.String.
func ParseQFormat(s string) (QFormat, error) {
	switch strings.ToLower(s) {
	case "fp8", "e4m3":
		return QFP8, nil
	case "bf16":
		return QBF16, nil
	}
	return 0, fmt.Errorf("mla: unknown Q format %q (want fp8 or bf16)", s)
}

// ElemBytes is the size of one Q element.
func (f QFormat) ElemBytes() int {
	if f == QBF16 {
		return 2
	}
	return 1
}

// Launch is one kernel launch's share of a batch: a contiguous range of token
// rows, all of one phase.
type Launch struct {
	Phase     metadata.Phase
	RowBegin  int // first token row of the launch in the shared buffers
	Rows      int // rows covered, padding included
	ValidRows int // rows [RowBegin, RowBegin+ValidRows) are real; the rest are padding
	SeqBegin  int // batch index of the launch's first sequence
	NumSeqs   int
	SeqLen    int // generation: the uniform query length; 0 for context
	// WriteScheduler is set on one launch per layer: its KV kernel resets
	// the tile counter and writes the bmm scales.
	WriteScheduler bool
	// FromHeader (generation-only batches) makes the kernels read
	// ValidRows, NumSeqs and SeqLen from the metadata buffer's header on the
	// device instead of from the launch, so one captured CUDA graph serves
	// every generation batch of its padded size. RowBegin and SeqBegin must
	// be 0 and Rows covers the padded batch.
	FromHeader bool
}

// FromHeader returns the launches of a generation-only batch marked to read
// their counts from the device header (see Launch.FromHeader); other
// batches are returned unchanged.
func FromHeader(ls []Launch) []Launch {
	if !headerBatch(ls) {
		return ls
	}
	return MarkFromHeader([]Launch{ls[0]})
}

// MarkFromHeader is FromHeader in place, for a caller that owns ls: it
// marks the launch of a generation-only batch and returns ls.
func MarkFromHeader(ls []Launch) []Launch {
	if headerBatch(ls) {
		ls[0].FromHeader = true
	}
	return ls
}

// headerBatch reports whether ls is a generation-only batch's one launch.
func headerBatch(ls []Launch) bool {
	return len(ls) == 1 && ls[0].Phase == metadata.Generation && ls[0].RowBegin == 0 && ls[0].SeqBegin == 0
}

func (l Launch) String() string {
	return fmt.Sprintf("%s rows [%d,%d) valid %d seqs [%d,%d) seq_len %d",
		l.Phase, l.RowBegin, l.RowBegin+l.Rows, l.ValidRows, l.SeqBegin, l.SeqBegin+l.NumSeqs, l.SeqLen)
}

// LayerArgs are one layer's inputs and outputs. Row t of every token-indexed
// buffer is token t of the batch.
type LayerArgs struct {
	Heads int

	// Latent holds the KV latent rows, read in place from the fused A
	// projection output: row t starts at LatentOffset + t*LatentStride*2
	// bytes and holds 512 bf16 values.
	Latent       Buffer
	LatentOffset int // bytes; a multiple of 16
	LatentStride int // elements between rows (q_lora_rank + 512 for the fused output); a multiple of 8

	QIn     Buffer // [rows][Heads][512] bf16
	QOut    Buffer // [rows][Heads][512] of QFormat
	QFormat QFormat
	QScale  float32 // per-tensor scale applied before e4m3 (QFP8 only)

	KVWeight Buffer // kv_a_layernorm weight, 512 float32

	// Eps is the config's rms_norm_eps, added to the mean square in both
	// RMSNorms (docs/DESIGN.md section 4.2). Part of the bit-exact contract:
	// every backend adds exactly this float32.
	Eps float32

	Rope          Buffer // [RopePositions][32]{cos, sin} float32
	RopePositions int

	Cache       Buffer // NumPages pages of Format
	CacheConfig kvcache.Config

	Meta      *MetadataBuffers
	Scheduler metadata.SchedulerParams
}

// Validate checks what every backend relies on before a launch.
func (a *LayerArgs) Validate(rows int) error {
	switch {
	case a.Heads <= 0:
		return fmt.Errorf("mla: Heads = %d, must be > 0", a.Heads)
	case a.LatentOffset%16 != 0 || a.LatentOffset < 0:
		return fmt.Errorf("mla: LatentOffset = %d bytes breaks 16-byte alignment", a.LatentOffset)
	case a.LatentStride%8 != 0 || a.LatentStride < numerics.HeadDim:
		return fmt.Errorf("mla: LatentStride = %d elements, must be >= 512 and a multiple of 8 (16-byte rows)", a.LatentStride)
	case a.QFormat != QFP8 && a.QFormat != QBF16:
		return fmt.Errorf("mla: QFormat = %d is unknown", a.QFormat)
	case a.Meta == nil:
		return errors.New("mla: LayerArgs.Meta is nil")
	case a.RopePositions <= 0:
		return fmt.Errorf("mla: RopePositions = %d, must be > 0", a.RopePositions)
	}
	if err := ValidateEps(a.Eps); err != nil {
		return err
	}
	if err := a.CacheConfig.Validate(); err != nil {
		return fmt.Errorf("mla: %w", err)
	}
	need := []struct {
		name string
		buf  Buffer
		n    int
	}{
		{"Latent", a.Latent, a.LatentOffset + ((rows-1)*a.LatentStride+numerics.HeadDim)*2},
		{"QIn", a.QIn, rows * a.Heads * numerics.HeadDim * 2},
		{"QOut", a.QOut, rows * a.Heads * numerics.HeadDim * a.QFormat.ElemBytes()},
		{"KVWeight", a.KVWeight, numerics.HeadDim * 4},
		{"Rope", a.Rope, a.RopePositions * numerics.RopeDim * 4},
		{"Cache", a.Cache, a.CacheConfig.PoolBytes()},
	}
	for _, n := range need {
		if n.buf == nil {
			return fmt.Errorf("mla: LayerArgs.%s is nil", n.name)
		}
		if n.buf.Len() < n.n {
			return fmt.Errorf("mla: LayerArgs.%s holds %d bytes, %d rows need %d", n.name, n.buf.Len(), rows, n.n)
		}
	}
	return nil
}

// MaxEps bounds LayerArgs.Eps: RMSNorm epsilons are 1e-5 or 1e-6 in
// practice, and a value above 1e-2 is a misread config field, not a model.
const MaxEps = 1e-2

// ValidateEps checks an rms_norm_eps as the kernels take it: finite, a
// normal float32 (a subnormal or zero eps no longer guards the division),
// at most MaxEps.
func ValidateEps(eps float32) error {
	if !(eps >= 0x1p-126 && eps <= MaxEps) { // also refuses NaN
		return fmt.Errorf("mla: Eps (rms_norm_eps) = %g, must be a normal float32 in [2^-126, %g]", eps, MaxEps)
	}
	return nil
}

// Backend runs the prologue kernels. Every backend must produce the bytes of
// docs/DESIGN.md section 4 exactly.
type Backend interface {
	Name() string
	Alloc(nbytes int) (Buffer, error)
	Free(b Buffer) error
	Write(dst Buffer, off int, src []byte) error
	Read(dst []byte, src Buffer, off int) error
	Fill(dst Buffer, off, n int, v byte) error

	// KVNormRopeStore normalizes each latent row of the launch with the
	// kv_a_layernorm weight, rotates its rope tail at the token's position,
	// quantizes it and stores it at the token's slot. Padding rows and
	// negative slots write nothing.
	KVNormRopeStore(ctx context.Context, l Launch, a *LayerArgs) error
	// QNormRopeQuant normalizes each (token, head) row of QIn, rotates its
	// rope tail and writes QOut. Padding rows are written as zeros.
	QNormRopeQuant(ctx context.Context, l Launch, a *LayerArgs) error

	// Synchronize waits for all work issued so far.
	Synchronize(ctx context.Context) error
	Close() error
}

// Plan turns one iteration's metadata into launches: one per phase present,
// over disjoint row ranges; padding rows belong to the last launch. The first
// launch writes the scheduler scalars.
func Plan(m *metadata.Metadata) []Launch { return AppendPlan(nil, m) }

// AppendPlan is Plan appending the launches to ls (at most two: a caller
// that reuses their memory allocates nothing).
func AppendPlan(ls []Launch, m *metadata.Metadata) []Launch {
	first := len(ls)
	if m.NumCtx > 0 {
		ls = append(ls, Launch{
			Phase: metadata.Context, RowBegin: 0, Rows: m.CtxTokens, ValidRows: m.CtxTokens,
			SeqBegin: 0, NumSeqs: m.NumCtx,
		})
	}
	if m.NumGen > 0 {
		ls = append(ls, Launch{
			Phase: metadata.Generation, RowBegin: m.CtxTokens, Rows: m.GenTokens, ValidRows: m.GenTokens,
			SeqBegin: m.NumCtx, NumSeqs: m.NumGen, SeqLen: m.GenSeqLen,
		})
	}
	if len(ls) > first {
		last := &ls[len(ls)-1]
		last.Rows += m.PaddedTokens - m.Tokens
		ls[first].WriteScheduler = true
	}
	return ls
}

// LayerRunner is an optional fast path a backend may offer for a whole
// layer (the CUDA backend hands all launches to its driver thread at once).
// It must behave exactly as RunLaunches.
type LayerRunner interface {
	RunLayer(ctx context.Context, launches []Launch, a *LayerArgs) error
}

// Graph is a captured sequence of launches that can be replayed.
type Graph interface {
	Launch() error
	Close() error
}

// MemoryReporter is an optional interface of backends that can say how
// much memory they can still allocate: the device's free memory on an
// accelerator, the host's available memory on the CPU backend. The engine
// takes it as its default MemoryLimit.
type MemoryReporter interface {
	FreeMemory() (int64, error)
}

// GraphCapturer is an optional interface of backends that can record the
// launches a function issues and replay them (CUDA graphs).
type GraphCapturer interface {
	Capture(f func() error) (Graph, error)
}

// RunLayer issues one layer's prologue: for every launch, the KV kernel and
// then the Q kernel. Every launch reads the same LayerArgs: there is no state
// that one phase could leave behind for the other.
func RunLayer(ctx context.Context, b Backend, launches []Launch, a *LayerArgs) error {
	if len(launches) == 0 {
		return errors.New("mla: no launches")
	}
	last := launches[len(launches)-1]
	if err := a.Validate(last.RowBegin + last.Rows); err != nil {
		return err
	}
	if lr, ok := b.(LayerRunner); ok {
		return lr.RunLayer(ctx, launches, a)
	}
	return RunLaunches(ctx, b, launches, a)
}

// RunLaunches is the generic path of RunLayer, without validation.
func RunLaunches(ctx context.Context, b Backend, launches []Launch, a *LayerArgs) error {
	for _, l := range launches {
		if err := b.KVNormRopeStore(ctx, l, a); err != nil {
			return fmt.Errorf("mla: %s KV launch (%v): %w", b.Name(), l, err)
		}
		if err := b.QNormRopeQuant(ctx, l, a); err != nil {
			return fmt.Errorf("mla: %s Q launch (%v): %w", b.Name(), l, err)
		}
	}
	return nil
}

// Census counts the prologue's kernels by kind, for tests and reports: a
// KV and a Q kernel for every launch of a phase. (The CUDA backend issues
// each launch's two as one fused grid; the census counts the work, which is
// the same either way.)
type Census struct {
	ContextKV, ContextQ, GenerationKV, GenerationQ int
}

// Add counts the two kernels of each launch.
func (c *Census) Add(ls []Launch) {
	for _, l := range ls {
		if l.Phase == metadata.Context {
			c.ContextKV++
			c.ContextQ++
		} else {
			c.GenerationKV++
			c.GenerationQ++
		}
	}
}

// Total is the number of KV and Q work units counted (two per launch,
// whether a backend issues them as two kernels or one fused grid).
func (c Census) Total() int { return c.ContextKV + c.ContextQ + c.GenerationKV + c.GenerationQ }

// Batcher is an optional interface of backends whose calls are handed to
// one owner thread (the CUDA backend's driver thread): Batch runs f there,
// so every backend call f makes is issued directly and a layer's launches
// cost one hand-over instead of one each. f must only issue work on the
// backend (no waiting on other goroutines).
type Batcher interface {
	Batch(f func() error) error
}

// Batch runs f through b's Batcher, or directly for backends without one.
func Batch(b Backend, f func() error) error {
	if bb, ok := b.(Batcher); ok {
		return bb.Batch(f)
	}
	return f()
}

// AsyncWriter is an optional interface of backends that can copy host
// memory into a buffer without waiting for the copy (the CUDA backend:
// page-locked staging memory, cuMemcpyHtoDAsync on the stream its launches
// run on). Backend.Write returns only once src may be reused, which on a
// device costs a round trip per call; a per-iteration upload (the metadata,
// the compressor plans) uses this instead where a backend offers it.
//
// The contract that keeps it safe: staging bytes handed to WriteAsync are
// read by the device some time after WriteAsync returns, so they must not
// change until WaitWrites has returned for their staging slice. The writer
// of the staging memory calls WaitWrites before each rewrite; it costs
// nothing when the backend has waited for its work since that slice's last
// copy (Synchronize, Write, Read), which the end of every iteration does,
// nor for copies from other staging slices issued since.
type AsyncWriter interface {
	// AllocStaging returns n bytes of zeroed host memory for WriteAsync to
	// copy from (page-locked on CUDA, outside the Go heap). It is the
	// backend's, freed when the backend closes: it must not be used after
	// Close.
	AllocStaging(n int) ([]byte, error)
	// WriteAsync enqueues a copy of src, which must lie inside one slice
	// AllocStaging returned, to dst at byte offset off. The copy is ordered
	// after the work issued before it and before the work issued after it
	// (launches, graph replays, and work other streams fork from the
	// backend's main stream after it). It returns without waiting: src must
	// not change until WaitWrites returns.
	WriteAsync(dst Buffer, off int, src []byte) error
	// WaitWrites returns once every copy WriteAsync enqueued from the
	// AllocStaging slice that holds staging (any range of it) has read
	// its source, so that slice may be rewritten. After Close it returns
	// an error.
	WaitWrites(staging []byte) error
}
