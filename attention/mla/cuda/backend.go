package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/cublaslt"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
)

// Source returns the CUDA source of the prologue kernels as NVRTC compiles
// it: the generated abi.h, then prologue.cu.
func Source() string { return kernels.PrologueSource() }

// Available reports why the CUDA backend cannot run here, or nil.
func Available() error {
	if err := driver.Available(); err != nil {
		return err
	}
	return driver.NVRTCAvailable()
}

// Options configure a Backend. The zero value is the default: device 0,
// programmatic dependent launch on, logs discarded.
type Options struct {
	Device int
	Logger zerolog.Logger
	// NoPDL turns off programmatic dependent launch (the default), with
	// which a kernel's launch overlaps the tail of the one before it.
	NoPDL bool
	// GEMMOwnMaxM: GEMMs of up to this many rows run the weight-streaming
	// kernel, larger ones cuBLASLt (0: the choice measured per shape in the
	// device's architecture description, internal/cudatune's Arch; -1:
	// cuBLASLt for every batch it accepts). See gemm.go.
	GEMMOwnMaxM int
	// NoCuBLASLt runs every GEMM on the own kernel (cuBLASLt is not loaded).
	NoCuBLASLt bool
	// GEMMWGMMA runs every FP8 GEMM on the sm_90a wgmma kernel
	// (gemm_wgmma.go); InitGEMM fails with ErrWGMMAUnavailable where it
	// cannot run (compute capability other than 9.0, a driver without
	// tensor maps).
	GEMMWGMMA bool
	// NoWGMMA keeps the wgmma kernel unloaded: the architecture
	// description's wgmma rules are ignored and the other two kernels run
	// every FP8 GEMM (the choice before the rules were measured).
	NoWGMMA bool
}

// Backend runs the prologue kernels on one device.
type Backend struct {
	ctx    *driver.Context
	stream *driver.Stream // where launches go: main, the side stream inside Side, the third inside Aux
	main   *driver.Stream // the main stream, never swapped
	mod    *driver.Module
	fns    map[string]*driver.Function
	// kernels finds the prologue's kernels by kind, format and path without
	// building their names (indexKernels).
	kernels map[kernelKey]*driver.Function
	// layerCalls pools RunLayer's hand-overs (layerCall).
	layerCalls sync.Pool
	log        zerolog.Logger
	opts       Options
	knobs      cudatune.Knobs
	arch       cudatune.Arch // the device's architecture description: resources, GEMM tiles and choices
	clog       string
	fork       sideStream    // the chain's second stream (fork.go)
	aux        auxStream     // the third stream (fork.go, mla.AuxRunner)
	gemm       gemmState     // gemm.go
	bf16       bf16GEMMState // bf16gemm.go

	// chainMod holds the chain kernels (chain.go); its functions are in fns.
	chainMod *driver.Module
	comp     compressState // the compressor's kernels (compress.go), loaded at first use
	topk     topkState     // the indexer's top-k kernels (topk.go), loaded at first use
	staging  stagingState  // WriteAsync's page-locked memory (staging.go)
	// workspaceSettled counts the bytes of the GEMMs' workspaces allocated
	// so far, or known never to be (workspaceBytes is all of them):
	// FreeMemory keeps the rest back.
	workspaceSettled atomic.Int64
}

// Buffer is device memory.
type Buffer struct {
	ptr driver.DevicePtr
	n   int
}

// Len is the size in bytes.
func (b *Buffer) Len() int { return b.n }

// Ptr is the device address.
func (b *Buffer) Ptr() driver.DevicePtr { return b.ptr }

// New opens the device, compiles (or loads from the cache) the kernels and
// creates the stream.
func New(opts Options) (*Backend, error) { return NewTuned(opts, cudatune.Knobs{}) }

// NewTuned is New with the launch-shape knobs of the module's tests and
// cmd/bench (internal/cudatune); the zero Knobs are New's shapes.
func NewTuned(opts Options, k cudatune.Knobs) (*Backend, error) {
	k = k.Defaults()
	// Static shared memory is at most 48 KiB a block.
	kvShared, qShared := abi.StreamingSharedBytes(k.Warps, k.KVDepth, k.QDepth)
	if k.Warps > 32 || kvShared > 48<<10 || qShared > 48<<10 {
		return nil, fmt.Errorf("cuda: Knobs.Warps = %d with KVDepth = %d and QDepth = %d exceeds 48 KiB of shared memory a block (KV %d bytes, Q %d bytes)",
			k.Warps, k.KVDepth, k.QDepth, kvShared, qShared)
	}
	if opts.NoWGMMA && opts.GEMMWGMMA {
		return nil, errors.New("cuda: Options.NoWGMMA and Options.GEMMWGMMA both set")
	}
	if m := k.WGMMAMulticast; m > 0 && m != 2 && m != 4 {
		return nil, fmt.Errorf("cuda: Knobs.WGMMAMulticast = %d, want 0, negative, 2 or 4", m)
	}
	if m := k.WGMMAWeightMulticast; m > 0 && m != 2 && m != 4 && m != 8 {
		return nil, fmt.Errorf("cuda: Knobs.WGMMAWeightMulticast = %d, want 0, negative, 2, 4 or 8", m)
	}
	for _, kern := range []cudatune.WGMMAKernel{k.WGMMAKernel, k.WGMMANarrow} {
		if kern < 0 || kern > cudatune.WGMMAWidePipe {
			return nil, fmt.Errorf("cuda: Knobs.WGMMAKernel or WGMMANarrow = %d names no kernel family", kern)
		}
	}
	if s := k.WGMMANarrowStages; s == 1 || s > 32 {
		return nil, fmt.Errorf("cuda: Knobs.WGMMANarrowStages = %d, want 0 or 2 .. 32", s)
	}
	if k.WGMMAClusterSplits > 8 {
		return nil, fmt.Errorf("cuda: Knobs.WGMMAClusterSplits = %d exceeds 8 blocks, the portable cluster size", k.WGMMAClusterSplits)
	}
	if k.QChunk > 1<<10 {
		return nil, fmt.Errorf("cuda: Knobs.QChunk = %d exceeds %d rows", k.QChunk, 1<<10)
	}
	if k.DirectWarps > 32 {
		return nil, fmt.Errorf("cuda: Knobs.DirectWarps = %d exceeds 32 warps a block", k.DirectWarps)
	}
	if k.DirectQRows > 8 {
		return nil, fmt.Errorf("cuda: Knobs.DirectQRows = %d exceeds 8 rows a warp", k.DirectQRows)
	}
	if k.DirectWarps*k.DirectMinBlocks > 64 {
		return nil, fmt.Errorf("cuda: Knobs.DirectMinBlocks = %d blocks of %d warps exceeds the 64 warps a multiprocessor holds",
			k.DirectMinBlocks, k.DirectWarps)
	}
	if _, err := bf16MMAKernelOf(k.BF16MMADepth, k.BF16MMAReduce, k.BF16MMAWarpRows); err != nil {
		return nil, err
	}
	if f := k.BF16WGMMAFinish; f < 0 || f > cudatune.BF16WGMMAFinishCluster {
		return nil, fmt.Errorf("cuda: Knobs.BF16WGMMAFinish = %d, want 0, %d (the reduction launch), %d (the unit's last block) or %d (clusters)",
			f, cudatune.BF16WGMMAFinishReduce, cudatune.BF16WGMMAFinishLast, cudatune.BF16WGMMAFinishCluster)
	}
	if k.IndexerKeys != cudatune.IndexerKeysSplit && k.IndexerKeys != cudatune.IndexerKeysFused {
		return nil, fmt.Errorf("cuda: Knobs.IndexerKeys = %d names no kernels", k.IndexerKeys)
	}
	if k.IndexerQuery < cudatune.IndexerQueryLate || k.IndexerQuery > cudatune.IndexerQueryTok {
		return nil, fmt.Errorf("cuda: Knobs.IndexerQuery = %d names no kernel", k.IndexerQuery)
	}
	if k.IndexerStream != cudatune.IndexerStreamMain && k.IndexerStream != cudatune.IndexerStreamAux {
		return nil, fmt.Errorf("cuda: Knobs.IndexerStream = %d names no stream", k.IndexerStream)
	}
	if k.CuBLASLtSplitK < cudatune.CuBLASLtSplitKAny || k.CuBLASLtSplitK > cudatune.CuBLASLtSplitKNone {
		return nil, fmt.Errorf("cuda: Knobs.CuBLASLtSplitK = %d names no choice", k.CuBLASLtSplitK)
	}
	c, err := driver.Open(opts.Device)
	if err != nil {
		return nil, err
	}
	p := c.Props()
	b := &Backend{ctx: c, log: opts.Logger, opts: opts, knobs: k, fns: map[string]*driver.Function{},
		arch: cudatune.ForDevice(p.Major, p.Minor, cudatune.Resources{SMs: p.SMCount, SharedPerBlockOptin: p.MaxSharedBytesOptin,
			SharedPerSM: p.SharedBytesPerSM, RegistersPerSM: p.RegistersPerSM, L2Bytes: p.L2Bytes})}
	if kern := k.WGMMANarrow; kern > 0 {
		b.arch.FP8.WGMMA.Use = append([]cudatune.OwnRule{{MaxN: cudatune.WGMMANarrowMaxN, MaxM: cudatune.WGMMANarrowMaxM, Kernel: kern,
			Source: "Knobs.WGMMANarrow"}}, b.arch.FP8.WGMMA.Use...)
	}
	if opts.NoWGMMA {
		b.arch.FP8.WGMMA.Use = nil
	}
	if s := k.WGMMANarrowStages; s > 0 {
		b.arch.FP8.WGMMA.NarrowMaxStages = s
	}
	if c := k.WGMMANarrowChunks; c > 0 {
		b.arch.FP8.WGMMA.NarrowMaxChunks = c
	}
	if s := k.WGMMAMaxSplits; s > 0 {
		b.arch.FP8.WGMMA.MaxSplits = s
	}
	if s := k.WGMMAMaxSMs; s > 0 {
		b.arch.FP8.WGMMA.MaxSMs = s
	}
	b.arch.FP8.WGMMA.Multicast = override(b.arch.FP8.WGMMA.Multicast, k.WGMMAMulticast)
	b.arch.FP8.WGMMA.WeightMulticast = override(b.arch.FP8.WGMMA.WeightMulticast, k.WGMMAWeightMulticast)
	b.arch.FP8.WGMMA.ClusterSplits = override(b.arch.FP8.WGMMA.ClusterSplits, k.WGMMAClusterSplits)
	b.layerCalls.New = b.newLayerCall
	if err := b.init(); err != nil {
		_ = c.Close()
		return nil, err
	}
	b.log.Debug().Str("device", p.Name).Str("arch", p.Arch()).Int("sms", p.SMCount).Msg("cuda backend ready")
	return b, nil
}

// loadModule compiles (or fetches from the cache) and loads one of the
// backend's sources, adding ptxas's resource report to CompileLog when
// Knobs.Verbose (compiling without the cache then).
func (b *Backend) loadModule(src, program string, opts driver.CompileOptions) (*driver.Module, error) {
	if b.knobs.Verbose {
		opts.Extra = append(opts.Extra, "--ptxas-options=-v")
		opts.NoCache = true
	}
	compiled, err := driver.CompileDetailed(src, program, opts)
	if err != nil {
		return nil, err
	}
	b.clog += compiled.Log
	return b.ctx.LoadModule(compiled.Cubin)
}

func (b *Backend) init() error {
	var err error
	if b.mod, err = b.load(prologueProgram); err != nil {
		return err
	}
	for _, k := range abi.Kernels() {
		if b.fns[k.Name], err = b.mod.Function(k.Name); err != nil {
			return fmt.Errorf("cuda: kernel %s: %w", k.Name, err)
		}
	}
	b.indexKernels()
	if err := b.loadChain(); err != nil {
		return fmt.Errorf("cuda: chain kernels: %w", err)
	}
	if b.stream, err = b.ctx.NewStream(); err != nil {
		return err
	}
	b.main = b.stream
	if err := b.fork.init(b.ctx); err != nil {
		return err
	}
	return b.aux.init(b.ctx)
}

// CompileLog is NVRTC's log of the kernels' compilation (with
// cudatune.Knobs.Verbose, the registers and spills of each kernel); empty on
// a cache hit.
func (b *Backend) CompileLog() string { return b.clog }

// Name is "cuda".
func (b *Backend) Name() string { return "cuda" }

// Context exposes the driver context (for benchmarks and graph capture).
func (b *Backend) Context() *driver.Context { return b.ctx }

// Stream is the stream every launch is issued on.
func (b *Backend) Stream() *driver.Stream { return b.stream }

// Props describes the device.
func (b *Backend) Props() driver.DeviceProps { return b.ctx.Props() }

var _ mla.MemoryReporter = (*Backend)(nil)

// FreeMemory implements mla.MemoryReporter: the device's free memory
// (cuMemGetInfo) less the GEMM workspaces the backend has yet to allocate
// at its first GEMMs (WorkspaceReserve), the engine's default MemoryLimit:
// a configuration within it does not run out of memory at its first GEMM.
func (b *Backend) FreeMemory() (int64, error) {
	free, _, err := b.ctx.MemInfo()
	if err != nil {
		return 0, fmt.Errorf("cuda: free device memory: %w", err)
	}
	return max(0, int64(min(free, 1<<62))-b.WorkspaceReserve()), nil
}

// workspaceBytes is every workspace the GEMMs allocate for themselves on
// first use: the FP8 and the bf16 kernels' split-K partials, one of each a
// stream, cuBLASLt's, one a stream too (unless Options.NoCuBLASLt), and
// the wgmma kernel's split counters, one array a stream, where it is to
// be loaded (forced, or chosen for some shape).
func (b *Backend) workspaceBytes() int64 {
	n := int64(len(b.gemm.parts))*gemmPartBytes + int64(len(b.bf16.parts))*(bf16MMAPartBytes+4*bf16MMACounters)
	if !b.opts.NoCuBLASLt {
		n += cublaslt.Workspaces * cublaslt.WorkspaceBytes
	}
	if b.wgmmaWanted() {
		n += wgmmaCounterArrays * wgmmaCounterBytes
	}
	if b.bf16WGMMAWanted() {
		n += int64(len(b.bf16.wg.counters)) * bf16WGMMACounterBytes
	}
	return n
}

// WorkspaceReserve is the part of the GEMMs' workspaces not allocated yet
// (nor known to be unneeded), which FreeMemory keeps back: 216 MiB and 60 KiB before
// the first GEMM on the H200, 0 once the FP8 and bf16 GEMMs have run.
func (b *Backend) WorkspaceReserve() int64 {
	return max(0, b.workspaceBytes()-b.workspaceSettled.Load())
}

// Alloc allocates device memory.
func (b *Backend) Alloc(n int) (mla.Buffer, error) {
	if n <= 0 {
		n = 16 // the driver refuses zero-byte allocations; keep a valid address
	}
	p, err := b.ctx.Alloc(n)
	if err != nil {
		return nil, err
	}
	return &Buffer{ptr: p, n: n}, nil
}

// Free releases device memory (after the stream's work completes).
func (b *Backend) Free(buf mla.Buffer) error {
	db, err := dev(buf)
	if err != nil {
		return err
	}
	if db.ptr == 0 {
		return nil
	}
	if err := b.syncAll(); err != nil {
		return err
	}
	err = b.ctx.Free(db.ptr)
	db.ptr, db.n = 0, 0
	return err
}

func dev(buf mla.Buffer) (*Buffer, error) {
	db, ok := buf.(*Buffer)
	if !ok {
		return nil, fmt.Errorf("cuda: buffer of type %T is not a CUDA buffer", buf)
	}
	return db, nil
}

func span(buf mla.Buffer, off, n int) (driver.DevicePtr, error) {
	db, err := dev(buf)
	if err != nil {
		return 0, err
	}
	if off < 0 || n < 0 || off+n > db.n {
		return 0, fmt.Errorf("cuda: range [%d,%d) outside a buffer of %d bytes", off, off+n, db.n)
	}
	return db.ptr + driver.DevicePtr(off), nil
}

// Write copies host bytes to the device, ordered after earlier launches.
func (b *Backend) Write(dst mla.Buffer, off int, src []byte) error {
	p, err := span(dst, off, len(src))
	if err != nil || len(src) == 0 {
		return err
	}
	if err := b.ctx.HtoDAsync(p, src, b.stream); err != nil {
		return err
	}
	return b.syncStream(b.stream) // src may be reused as soon as we return
}

// Read copies device bytes to the host after earlier launches complete.
func (b *Backend) Read(dst []byte, src mla.Buffer, off int) error {
	p, err := span(src, off, len(dst))
	if err != nil || len(dst) == 0 {
		return err
	}
	if err := b.ctx.DtoHAsync(dst, p, b.stream); err != nil {
		return err
	}
	return b.syncStream(b.stream)
}

// Fill sets device bytes, ordered on the stream.
func (b *Backend) Fill(dst mla.Buffer, off, n int, v byte) error {
	p, err := span(dst, off, n)
	if err != nil || n == 0 {
		return err
	}
	return b.ctx.Memset8Async(p, v, n, b.stream)
}

// Synchronize waits for both streams.
func (b *Backend) Synchronize(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return b.syncAll()
}

// Close releases the module, stream and context.
func (b *Backend) Close() error {
	errs := []error{b.fork.close(), b.aux.close()}
	if b.stream != nil {
		errs = append(errs, b.stream.Synchronize(), b.closeGEMM(), b.closeCompress(), b.closeTopK(), b.stream.Destroy())
	}
	// After the wait above no copy reads staging memory any more.
	errs = append(errs, b.staging.close())
	if b.mod != nil {
		errs = append(errs, b.mod.Unload())
	}
	if b.chainMod != nil {
		errs = append(errs, b.chainMod.Unload())
	}
	errs = append(errs, b.ctx.Close())
	return errors.Join(errs...)
}

// launchParams packs the Params (kernels/cuda/abi) of one launch into dst
// (abi.Params.Size() bytes) and returns them: in, out and weight are the
// KV or Q part's buffers, scale its per-tensor scale.
func launchParams(dst []byte, l mla.Launch, a *mla.LayerArgs, in, out, weight driver.DevicePtr, inStride uint64, scale float32) ([]byte, error) {
	rope, err := dev(a.Rope)
	if err != nil {
		return nil, err
	}
	cfg, s := a.CacheConfig, a.Scheduler
	return packParams(dst, l, a.Meta, paramFields{
		in: in, out: out, weight: weight, rope: rope.ptr, inStride: inStride,
		heads: a.Heads, ropePositions: a.RopePositions,
		pageSizeLog2: bits.TrailingZeros(uint(cfg.PageSize)), pageBytes: cfg.Format.PageBytes(cfg.PageSize), numPages: cfg.NumPages,
		scale: scale, qDeq: s.QDeq, kvDeq: s.KVDeq, qScaling: s.QScaling, oScale: s.OScale, eps: a.Eps,
	})
}

// paramFields are the Params fields a kernel's launches choose; packParams
// derives the rest from the launch and the metadata.
type paramFields struct {
	in, out, weight, rope                driver.DevicePtr
	inStride                             uint64 // bytes between the input's tokens
	heads, ropePositions                 int
	pageSizeLog2, pageBytes, numPages    int
	scale, qDeq, kvDeq, qScaling, oScale float32
	eps                                  float32
}

// packParams packs the Params (kernels/cuda/abi) of launch l into dst
// (abi.Params.Size() bytes) and returns them: f's fields, the metadata's
// pointers (the scheduler's only for a launch that writes it), and the
// launch's rows, sequences and header flag, which every kernel reading
// Params resolves a row's sequence and position from (with_header,
// resolve).
func packParams(dst []byte, l mla.Launch, m *mla.MetadataBuffers, f paramFields) ([]byte, error) {
	meta, err := dev(m.Buf)
	if err != nil {
		return nil, err
	}
	at := func(off int) uint64 { return uint64(meta.ptr + driver.DevicePtr(off)) }
	var sched uint64
	if l.WriteScheduler {
		sched = at(m.OffScheduler)
	}
	seqLenLog2 := int32(-1)
	if l.SeqLen > 0 && l.SeqLen&(l.SeqLen-1) == 0 {
		seqLenLog2 = int32(bits.TrailingZeros(uint(l.SeqLen)))
	}
	p := abi.Params.PackInto(dst)
	p.Ptr(abi.ParamIn, uint64(f.in))
	p.Ptr(abi.ParamOut, uint64(f.out))
	p.Ptr(abi.ParamWeight, uint64(f.weight))
	p.Ptr(abi.ParamRope, uint64(f.rope))
	p.Ptr(abi.ParamCuQ, at(m.OffCuQ))
	p.Ptr(abi.ParamCached, at(m.OffCached))
	p.Ptr(abi.ParamKVLen, at(m.OffKVLen))
	p.Ptr(abi.ParamBlockTables, at(m.OffBlockTables))
	p.Ptr(abi.ParamSched, sched)
	p.Ptr(abi.ParamHdr, at(m.OffHeader))
	p.U64(abi.ParamInStride, f.inStride)
	p.I32(abi.ParamRowBegin, int32(l.RowBegin))
	p.I32(abi.ParamRows, int32(l.Rows))
	p.I32(abi.ParamValidRows, int32(l.ValidRows))
	p.I32(abi.ParamSeqBegin, int32(l.SeqBegin))
	p.I32(abi.ParamNumSeqs, int32(l.NumSeqs))
	p.I32(abi.ParamSeqLen, int32(l.SeqLen))
	p.I32(abi.ParamSeqLenLog2, seqLenLog2)
	p.I32(abi.ParamHeads, int32(f.heads))
	p.I32(abi.ParamRopePositions, int32(f.ropePositions))
	p.I32(abi.ParamPageStride, int32(m.PageStride))
	p.I32(abi.ParamPageSizeLog2, int32(f.pageSizeLog2))
	p.I32(abi.ParamPageBytes, int32(f.pageBytes))
	p.I32(abi.ParamNumPages, int32(f.numPages))
	p.F32(abi.ParamScale, f.scale)
	p.F32(abi.ParamQDeq, f.qDeq)
	p.F32(abi.ParamKVDeq, f.kvDeq)
	p.F32(abi.ParamQScaling, f.qScaling)
	p.F32(abi.ParamOScale, f.oScale)
	p.F32(abi.ParamEps, f.eps)
	p.Bool(abi.ParamWriteSched, l.WriteScheduler)
	p.Bool(abi.ParamFromHdr, l.FromHeader)
	return p.Bytes()
}

// grid sizes a streaming launch over n work rows: one warp a row while that
// fits the cap (small batches keep every row's latency short), else the cap
// of BlocksPerSM blocks a multiprocessor, each warp streaming its range.
func (b *Backend) grid(n int) (driver.Dim3, driver.Dim3) {
	blocks := (n + b.knobs.Warps - 1) / b.knobs.Warps
	limit := b.ctx.Props().SMCount * b.knobs.BlocksPerSM
	if b.knobs.MaxBlocks > 0 {
		limit = b.knobs.MaxBlocks
	}
	blocks = max(1, min(blocks, limit))
	return driver.Dim3{uint32(blocks), 1, 1}, driver.Dim3{uint32(32 * b.knobs.Warps), 1, 1}
}

// directGrid sizes a direct-path part over n work rows, perWarp rows a warp
// (KV: 1; Q: Knobs.DirectQRows), in blocks of blockWarps warps (the
// launch's Knobs.DirectBlockWarps, the same for both parts of a fused
// grid): every row covered (the kernels do not loop).
func directGrid(n, perWarp, blockWarps int) (driver.Dim3, driver.Dim3) {
	warps := (n + perWarp - 1) / perWarp
	blocks := max(1, (warps+blockWarps-1)/blockWarps)
	return driver.Dim3{uint32(blocks), 1, 1}, driver.Dim3{uint32(32 * blockWarps), 1, 1}
}

// pathFor picks a launch's kernels by its size in Q rows (tokens x heads,
// padding included, the same for its KV and Q parts so that a fused grid
// has one path) and its Q format: the direct path for small batches, where
// latency sets the time, and for bf16 Q at every size; the streaming
// pipeline for large batches with FP8 Q (cudatune.Knobs.DirectMaxRows,
// DirectMaxRowsBF16). A FromHeader launch is sized by its Rows (the padded
// batch), never by the counts the header holds.
func pathFor(k cudatune.Knobs, l mla.Launch, heads int, q mla.QFormat) abi.Path {
	if k.Direct(l.Rows*heads, q == mla.QBF16) {
		return abi.Direct
	}
	return abi.Streaming
}

func (b *Backend) path(l mla.Launch, a *mla.LayerArgs) abi.Path {
	return pathFor(b.knobs, l, a.Heads, a.QFormat)
}

// kvAlonePath is the path of a KV kernel launched on its own
// (KVNormRopeStore, ForkKV): only a fused grid needs one path for both
// parts, and the KV kernel alone streams faster past the FP8 Q threshold
// whatever the Q format (H200, cold, V4-Pro at 16K context tokens: 16.5
// against 17.3 us direct; at 64K 44.2 against 47.7).
func (b *Backend) kvAlonePath(l mla.Launch, a *mla.LayerArgs) abi.Path {
	return pathFor(b.knobs, l, a.Heads, mla.QFP8)
}

// kvGrid and qGrid size a launch's KV part (its latent rows) and Q part
// (its (token, head) rows) on path p; on the direct path the block's warps
// follow the launch's Q rows.
func (b *Backend) kvGrid(p abi.Path, l mla.Launch, heads int) (driver.Dim3, driver.Dim3) {
	if p == abi.Direct {
		return directGrid(l.Rows, 1, b.knobs.DirectBlockWarps(l.Rows*heads))
	}
	return b.grid(l.Rows)
}

func (b *Backend) qGrid(p abi.Path, l mla.Launch, heads int) (driver.Dim3, driver.Dim3) {
	if p == abi.Direct {
		return directGrid(l.Rows*heads, b.knobs.DirectQRows, b.knobs.DirectBlockWarps(l.Rows*heads))
	}
	return b.grid(l.Rows * heads)
}

// override is a knob over the architecture description's value: 0 keeps
// it, a negative knob turns it off (0), a positive one replaces it.
func override(arch, knob int) int {
	switch {
	case knob < 0:
		return 0
	case knob > 0:
		return knob
	}
	return arch
}

func (b *Backend) launch(fn *driver.Function, grid, block driver.Dim3, args ...any) error {
	return b.launchShared(fn, grid, block, 0, args...)
}

// launchShared launches fn on the main stream with dynamic shared memory,
// with programmatic dependent launch unless Options.NoPDL.
func (b *Backend) launchShared(fn *driver.Function, grid, block driver.Dim3, shared int, args ...any) error {
	if !b.opts.NoPDL {
		return b.ctx.LaunchPDL(fn, grid, block, uint32(shared), b.stream, args...)
	}
	return b.ctx.Launch(fn, grid, block, uint32(shared), b.stream, args...)
}

// launchCluster is launchShared in thread-block clusters of the shape
// cluster, for kernels that share memory across a cluster (a split-K
// reduction through distributed shared memory): PDL unless Options.NoPDL.
// Every grid dimension must be a multiple of cluster's, and the device must
// have cluster launches (driver.DeviceProps.ClusterLaunches): there is no
// fallback, since such a kernel computes wrong results without its
// cluster. More than 8 blocks a cluster needs
// driver.FuncNonPortableClusterSizeAllowed set on fn first.
func (b *Backend) launchCluster(fn *driver.Function, grid, block, cluster driver.Dim3, shared int, args ...any) error {
	opts := driver.LaunchOptions{PDL: !b.opts.NoPDL, Cluster: cluster}
	return b.ctx.LaunchWith(fn, grid, block, uint32(shared), b.stream, opts, args...)
}

// kernelKey names a prologue kernel without its string (abi.Kernel's
// fields).
type kernelKey struct {
	kind    abi.KernelKind
	format  kvcache.Format // KindKV, KindLayer
	qFormat mla.QFormat    // KindQ, KindLayer
	path    abi.Path
}

// indexKernels fills Backend.kernels from fns (every kernel of
// abi.Kernels, loaded).
func (b *Backend) indexKernels() {
	b.kernels = map[kernelKey]*driver.Function{}
	for _, k := range abi.Kernels() {
		key := kernelKey{kind: k.Kind, path: k.Path}
		if k.Kind != abi.KindQ {
			key.format = k.Format
		}
		if k.Kind != abi.KindKV {
			key.qFormat = k.QFormat
		}
		b.kernels[key] = b.fns[k.Name]
	}
}

// kernel returns a loaded prologue kernel; a combination without one is
// refused with abi's error that names it.
func (b *Backend) kernel(key kernelKey) (*driver.Function, error) {
	if fn := b.kernels[key]; fn != nil {
		return fn, nil
	}
	var err error
	switch key.kind {
	case abi.KindKV:
		_, err = abi.KVKernel(key.format, key.path)
	case abi.KindQ:
		_, err = abi.QKernel(key.qFormat, key.path)
	default:
		_, err = abi.LayerKernel(key.format, key.qFormat, key.path)
	}
	if err == nil {
		err = fmt.Errorf("cuda: no %v kernel for cache format %v, Q format %v on the %v path", key.kind, key.format, key.qFormat, key.path)
	}
	return nil, err
}

// kvLaunch resolves one launch's KV kernel alone on its path
// (kvAlonePath), its grid and its packed parameters (the main stream's
// launch and the side stream's share it).
func (b *Backend) kvLaunch(l mla.Launch, a *mla.LayerArgs) (fn *driver.Function, grid, block driver.Dim3, p driver.Bytes, err error) {
	path := b.kvAlonePath(l, a)
	if fn, err = b.kernel(kernelKey{kind: abi.KindKV, format: a.CacheConfig.Format, path: path}); err != nil {
		return nil, grid, block, nil, err
	}
	if p, err = kvParams(make([]byte, abi.Params.Size()), l, a); err != nil {
		return nil, grid, block, nil, err
	}
	grid, block = b.kvGrid(path, l, a.Heads)
	return fn, grid, block, p, nil
}

// kvParams and qParams pack a launch's KV and Q Params into dst.
func kvParams(dst []byte, l mla.Launch, a *mla.LayerArgs) ([]byte, error) {
	lat, err := dev(a.Latent)
	if err != nil {
		return nil, err
	}
	cache, err := dev(a.Cache)
	if err != nil {
		return nil, err
	}
	w, err := dev(a.KVWeight)
	if err != nil {
		return nil, err
	}
	return launchParams(dst, l, a, lat.ptr+driver.DevicePtr(a.LatentOffset), cache.ptr, w.ptr, uint64(a.LatentStride)*2, a.CacheConfig.KVScale)
}

func qParams(dst []byte, l mla.Launch, a *mla.LayerArgs) ([]byte, error) {
	qin, err := dev(a.QIn)
	if err != nil {
		return nil, err
	}
	qout, err := dev(a.QOut)
	if err != nil {
		return nil, err
	}
	return launchParams(dst, l, a, qin.ptr, qout.ptr, 0, 1024, a.QScale)
}

// KVNormRopeStore implements mla.Backend.
func (b *Backend) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fn, grid, block, p, err := b.kvLaunch(l, a)
	if err != nil {
		return err
	}
	return b.launch(fn, grid, block, p)
}

// QNormRopeQuant implements mla.Backend.
func (b *Backend) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	path := b.path(l, a)
	fn, err := b.kernel(kernelKey{kind: abi.KindQ, qFormat: a.QFormat, path: path})
	if err != nil {
		return err
	}
	p, err := qParams(make([]byte, abi.Params.Size()), l, a)
	if err != nil {
		return err
	}
	grid, block := b.qGrid(path, l, a.Heads)
	return b.launch(fn, grid, block, driver.Bytes(p))
}

// layerCall is one RunLayer's hand-over to the driver thread, with the
// memory its launches are packed in: pooled (Backend.layerCalls), its
// function bound once, so an eager layer allocates nothing.
type layerCall struct {
	b        *Backend
	ctx      context.Context
	launches []mla.Launch
	a        *mla.LayerArgs
	issue    func() error // issueLayer, bound once
	kv, q    []byte       // abi.Params.Size() bytes each
	kvBlocks [4]byte      // the fused kernel's int: where its Q part's blocks begin
}

func (b *Backend) newLayerCall() any {
	n := abi.Params.Size()
	buf := make([]byte, 2*n)
	c := &layerCall{b: b, kv: buf[:n:n], q: buf[n:]}
	c.issue = c.issueLayer
	return c
}

// issueLayer runs on the driver thread: each launch's KV and Q work as one
// fused grid.
func (c *layerCall) issueLayer() error {
	for _, l := range c.launches {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		if err := c.b.layerLaunch(c, l); err != nil {
			return fmt.Errorf("cuda: fused %v launch: %w", l, err)
		}
	}
	return nil
}

// layerLaunch issues a launch's KV and Q work as one grid (the layer_*
// kernels): the KV part's blocks first, then the Q part's.
func (b *Backend) layerLaunch(c *layerCall, l mla.Launch) error {
	a := c.a
	path := b.path(l, a)
	fn, err := b.kernel(kernelKey{kind: abi.KindLayer, format: a.CacheConfig.Format, qFormat: a.QFormat, path: path})
	if err != nil {
		return err
	}
	pkv, err := kvParams(c.kv, l, a)
	if err != nil {
		return err
	}
	pq, err := qParams(c.q, l, a)
	if err != nil {
		return err
	}
	kvGrid, block := b.kvGrid(path, l, a.Heads)
	qGrid, _ := b.qGrid(path, l, a.Heads)
	grid := driver.Dim3{kvGrid[0] + qGrid[0], 1, 1}
	binary.LittleEndian.PutUint32(c.kvBlocks[:], kvGrid[0]) // int32 on the device
	return b.ctx.LaunchValues(fn, grid, block, 0, b.stream, !b.opts.NoPDL, pkv, pq, c.kvBlocks[:])
}

// Time measures the device time of the work f issues on the stream, with
// CUDA events.
func (b *Backend) Time(ctx context.Context, f func() error) (time.Duration, error) {
	start, err := b.ctx.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := b.ctx.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	if err := start.Record(b.stream); err != nil {
		return 0, err
	}
	if err := f(); err != nil {
		return 0, err
	}
	if err := end.Record(b.stream); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	ms, err := b.ctx.ElapsedMs(start, end)
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), ctx.Err()
}

var _ mla.Backend = (*Backend)(nil)

// RunLayer is mla's optional fast path: each launch's KV and Q work goes
// out as one fused grid (unless cudatune.Knobs.SeparateLaunches), and the
// layer's launches are handed to the context's owner thread in one batch
// instead of one hand-over each.
func (b *Backend) RunLayer(ctx context.Context, launches []mla.Launch, a *mla.LayerArgs) error {
	if b.knobs.SeparateLaunches {
		return b.ctx.Do(func() error { return mla.RunLaunches(ctx, b, launches, a) })
	}
	c := b.layerCalls.Get().(*layerCall)
	c.ctx, c.launches, c.a = ctx, launches, a
	err := b.ctx.Do(c.issue)
	c.ctx, c.launches, c.a = nil, nil, nil
	b.layerCalls.Put(c)
	return err
}

// Graph is a captured, instantiated CUDA graph of launches on the backend's
// stream. The buffers it reads and writes keep their addresses, so replaying
// it after new metadata is uploaded runs the new iteration.
type Graph struct {
	b    *Backend
	g    *driver.Graph
	exec *driver.GraphExec
}

// Capture records the launches f issues on the stream (without running
// them) and instantiates them as a graph. f must only launch: no copies
// that synchronize.
func (b *Backend) Capture(f func() error) (mla.Graph, error) {
	if err := b.ctx.BeginCapture(b.stream); err != nil {
		return nil, err
	}
	ferr := b.ctx.Do(f)
	g, err := b.ctx.EndCapture(b.stream)
	if ferr != nil || err != nil {
		if g != nil {
			_ = g.Destroy()
		}
		return nil, errors.Join(ferr, err)
	}
	exec, err := b.ctx.Instantiate(g)
	if err != nil {
		_ = g.Destroy()
		return nil, err
	}
	return &Graph{b: b, g: g, exec: exec}, nil
}

// Launch replays the graph on the backend's stream.
func (g *Graph) Launch() error { return g.b.ctx.GraphLaunch(g.exec, g.b.stream) }

// Close destroys the graph.
func (g *Graph) Close() error { return errors.Join(g.exec.Destroy(), g.g.Destroy()) }

// Batch implements mla.Batcher: f runs on the driver thread, where every
// call of the backend it makes is issued without a further hand-over.
func (b *Backend) Batch(f func() error) error { return b.ctx.Do(f) }
