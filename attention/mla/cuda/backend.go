package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
)

// Source returns the embedded CUDA source of the prologue kernels.
func Source() string { return kernels.PrologueSource() }

// Available reports why the CUDA backend cannot run here, or nil.
func Available() error {
	if err := driver.Available(); err != nil {
		return err
	}
	return driver.NVRTCAvailable()
}

// Options configure a Backend.
type Options struct {
	Device int
	Logger zerolog.Logger
	// Warps is the number of warps per block (0: 8); each warp streams a
	// contiguous range of rows.
	Warps int
	// KVDepth and QDepth are the rows each warp keeps in flight (0: 4).
	KVDepth, QDepth int
	// BlocksPerSM caps the grid at BlocksPerSM blocks per multiprocessor
	// (0: 4); smaller batches get one warp per row.
	BlocksPerSM int
	// MaxBlocks, when set, caps the grid instead (tests use it to make a
	// few warps stream long ranges).
	MaxBlocks int
	// NoPDL turns off programmatic dependent launch (the default), with
	// which a kernel's launch overlaps the tail of the one before it.
	NoPDL bool
	// Verbose keeps ptxas's resource report (registers, spills) in CompileLog.
	Verbose bool
	// SeparateLaunches makes RunLayer issue the KV and Q kernels as two
	// launches instead of one fused layer launch (for tests and comparison).
	SeparateLaunches bool
	// GEMMOwnMaxM: GEMMs of up to this many rows run the weight-streaming
	// kernel, larger ones cuBLASLt (0: DefaultGEMMOwnMaxM; -1: cuBLASLt for
	// every batch it accepts). See gemm.go.
	GEMMOwnMaxM int
	// NoCuBLASLt runs every GEMM on the own kernel (cuBLASLt is not loaded).
	NoCuBLASLt bool
}

// Backend runs the prologue kernels on one device.
type Backend struct {
	ctx    *driver.Context
	stream *driver.Stream
	mod    *driver.Module
	fns    map[string]*driver.Function
	log    zerolog.Logger
	opts   Options
	clog   string
	fork   sideStream // the chain's second stream (fork.go)
	gemm   gemmState  // gemm.go

	// chainMod holds the chain kernels (chain.go); its functions are in fns.
	chainMod *driver.Module
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

var kernelNames = []string{"kv_fp8_ue8m0", "kv_bf16", "kv_fp8_pertensor", "q_fp8", "q_bf16", "e4m3_sweep", "bf16_sweep",
	"layer_fp8_ue8m0_qfp8", "layer_fp8_ue8m0_qbf16", "layer_bf16_qfp8", "layer_bf16_qbf16",
	"layer_fp8_pertensor_qfp8", "layer_fp8_pertensor_qbf16"}

// New opens the device, compiles (or loads from the cache) the kernels and
// creates the stream.
func New(opts Options) (*Backend, error) {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&opts.Warps, 8)
	def(&opts.KVDepth, 4)
	def(&opts.QDepth, 4)
	def(&opts.BlocksPerSM, 4)
	// Static shared memory is at most 48 KiB a block: warps x depth x slot.
	if opts.Warps > 32 || opts.Warps*opts.KVDepth*1280 > 48<<10 || opts.Warps*opts.QDepth*1024 > 48<<10 {
		return nil, fmt.Errorf("cuda: Options.Warps = %d with KVDepth = %d and QDepth = %d exceeds 48 KiB of shared memory a block (warps x depth x 1280 or 1024 bytes)",
			opts.Warps, opts.KVDepth, opts.QDepth)
	}
	c, err := driver.Open(opts.Device)
	if err != nil {
		return nil, err
	}
	b := &Backend{ctx: c, log: opts.Logger, opts: opts, fns: map[string]*driver.Function{}}
	if err := b.init(); err != nil {
		_ = c.Close()
		return nil, err
	}
	p := c.Props()
	b.log.Debug().Str("device", p.Name).Str("arch", p.Arch()).Int("sms", p.SMCount).Msg("cuda backend ready")
	return b, nil
}

func (b *Backend) init() error {
	opts := driver.CompileOptions{
		Arch: b.ctx.Props().Arch(),
		Defines: map[string]string{
			"PIPE_WARPS": strconv.Itoa(b.opts.Warps),
			"KV_DEPTH":   strconv.Itoa(b.opts.KVDepth),
			"Q_DEPTH":    strconv.Itoa(b.opts.QDepth),
		},
	}
	if b.opts.Verbose {
		opts.Extra = []string{"--ptxas-options=-v"}
		opts.NoCache = true
	}
	compiled, err := driver.CompileDetailed(kernels.PrologueSource(), "prologue.cu", opts)
	if err != nil {
		return err
	}
	b.clog = compiled.Log
	if b.mod, err = b.ctx.LoadModule(compiled.Cubin); err != nil {
		return err
	}
	for _, n := range kernelNames {
		if b.fns[n], err = b.mod.Function(n); err != nil {
			return err
		}
	}
	if err := b.loadChain(); err != nil {
		return fmt.Errorf("cuda: chain kernels: %w", err)
	}
	if b.stream, err = b.ctx.NewStream(); err != nil {
		return err
	}
	return b.fork.init(b.ctx)
}

// CompileLog is NVRTC's log of the kernels' compilation (with Verbose, the
// registers and spills of each kernel); empty on a cache hit.
func (b *Backend) CompileLog() string { return b.clog }

// Name is "cuda".
func (b *Backend) Name() string { return "cuda" }

// Context exposes the driver context (for benchmarks and graph capture).
func (b *Backend) Context() *driver.Context { return b.ctx }

// Stream is the stream every launch is issued on.
func (b *Backend) Stream() *driver.Stream { return b.stream }

// Props describes the device.
func (b *Backend) Props() driver.DeviceProps { return b.ctx.Props() }

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
	return b.stream.Synchronize() // src may be reused as soon as we return
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
	return b.stream.Synchronize()
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
	errs := []error{b.fork.close()}
	if b.stream != nil {
		errs = append(errs, b.stream.Synchronize(), b.closeGEMM(), b.stream.Destroy())
	}
	if b.mod != nil {
		errs = append(errs, b.mod.Unload())
	}
	if b.chainMod != nil {
		errs = append(errs, b.chainMod.Unload())
	}
	errs = append(errs, b.ctx.Close())
	return errors.Join(errs...)
}

// paramsSize is sizeof(Params) in prologue.cu.
const paramsSize = 168

// packParams lays out the kernel's Params struct: ten pointers, the input
// row stride, then 4-byte fields in declaration order.
func packParams(ptrs [10]driver.DevicePtr, inStride uint64, ints []int32, floats []float32, tail []int32) driver.Bytes {
	p := make([]byte, paramsSize)
	le := binary.LittleEndian
	for i, v := range ptrs {
		le.PutUint64(p[8*i:], uint64(v))
	}
	le.PutUint64(p[80:], inStride)
	off := 88
	for _, v := range ints {
		le.PutUint32(p[off:], uint32(v))
		off += 4
	}
	for _, v := range floats {
		le.PutUint32(p[off:], math.Float32bits(v))
		off += 4
	}
	for _, v := range tail {
		le.PutUint32(p[off:], uint32(v))
		off += 4
	}
	if off > paramsSize {
		panic("cuda: Params overflow")
	}
	return p
}

// launchParams builds the Params of one launch.
func (b *Backend) launchParams(l mla.Launch, a *mla.LayerArgs, in, out, weight driver.DevicePtr, inStride uint64, scale float32) (driver.Bytes, error) {
	meta, err := dev(a.Meta.Buf)
	if err != nil {
		return nil, err
	}
	rope, err := dev(a.Rope)
	if err != nil {
		return nil, err
	}
	m := meta.ptr
	var sched driver.DevicePtr
	if l.WriteScheduler {
		sched = m + driver.DevicePtr(a.Meta.OffScheduler)
	}
	ptrs := [10]driver.DevicePtr{in, out, weight, rope.ptr,
		m + driver.DevicePtr(a.Meta.OffCuQ), m + driver.DevicePtr(a.Meta.OffCached),
		m + driver.DevicePtr(a.Meta.OffKVLen), m + driver.DevicePtr(a.Meta.OffBlockTables), sched,
		m + driver.DevicePtr(a.Meta.OffHeader)}
	seqLenLog2 := int32(-1)
	if l.SeqLen > 0 && l.SeqLen&(l.SeqLen-1) == 0 {
		seqLenLog2 = int32(bits.TrailingZeros(uint(l.SeqLen)))
	}
	cfg := a.CacheConfig
	ints := []int32{int32(l.RowBegin), int32(l.Rows), int32(l.ValidRows), int32(l.SeqBegin), int32(l.NumSeqs),
		int32(l.SeqLen), seqLenLog2, int32(a.Heads), int32(a.RopePositions), int32(a.Meta.PageStride),
		int32(bits.TrailingZeros(uint(cfg.PageSize))), int32(cfg.Format.PageBytes(cfg.PageSize)), int32(cfg.NumPages)}
	s := a.Scheduler
	floats := []float32{scale, s.QDeq, s.KVDeq, s.QScaling, s.OScale}
	ws := int32(0)
	if l.WriteScheduler {
		ws = 1
	}
	fromHdr := int32(0)
	if l.FromHeader {
		fromHdr = 1
	}
	return packParams(ptrs, inStride, ints, floats, []int32{ws, fromHdr}), nil
}

// grid sizes a streaming launch over n work rows: one warp a row while that
// fits the cap (small batches keep every row's latency short), else the cap
// of BlocksPerSM blocks a multiprocessor, each warp streaming its range.
func (b *Backend) grid(n int) (driver.Dim3, driver.Dim3) {
	blocks := (n + b.opts.Warps - 1) / b.opts.Warps
	limit := b.ctx.Props().SMCount * b.opts.BlocksPerSM
	if b.opts.MaxBlocks > 0 {
		limit = b.opts.MaxBlocks
	}
	blocks = max(1, min(blocks, limit))
	return driver.Dim3{uint32(blocks), 1, 1}, driver.Dim3{uint32(32 * b.opts.Warps), 1, 1}
}

func kvKernel(f kvcache.Format) (string, error) {
	switch f {
	case kvcache.FormatFP8UE8M0:
		return "kv_fp8_ue8m0", nil
	case kvcache.FormatBF16:
		return "kv_bf16", nil
	case kvcache.FormatFP8PerTensor:
		return "kv_fp8_pertensor", nil
	}
	return "", fmt.Errorf("cuda: no KV kernel for cache format %v", f)
}

func (b *Backend) launch(fn *driver.Function, grid, block driver.Dim3, args ...any) error {
	if !b.opts.NoPDL {
		return b.ctx.LaunchPDL(fn, grid, block, 0, b.stream, args...)
	}
	return b.ctx.Launch(fn, grid, block, 0, b.stream, args...)
}

func (b *Backend) kvParams(l mla.Launch, a *mla.LayerArgs) (driver.Bytes, error) {
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
	return b.launchParams(l, a, lat.ptr+driver.DevicePtr(a.LatentOffset), cache.ptr, w.ptr, uint64(a.LatentStride)*2, a.CacheConfig.KVScale)
}

func (b *Backend) qParams(l mla.Launch, a *mla.LayerArgs) (driver.Bytes, error) {
	qin, err := dev(a.QIn)
	if err != nil {
		return nil, err
	}
	qout, err := dev(a.QOut)
	if err != nil {
		return nil, err
	}
	return b.launchParams(l, a, qin.ptr, qout.ptr, 0, 1024, a.QScale)
}

// KVNormRopeStore implements mla.Backend.
func (b *Backend) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name, err := kvKernel(a.CacheConfig.Format)
	if err != nil {
		return err
	}
	p, err := b.kvParams(l, a)
	if err != nil {
		return err
	}
	grid, block := b.grid(l.Rows)
	return b.launch(b.fns[name], grid, block, p)
}

// QNormRopeQuant implements mla.Backend.
func (b *Backend) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := "q_fp8"
	if a.QFormat == mla.QBF16 {
		name = "q_bf16"
	}
	p, err := b.qParams(l, a)
	if err != nil {
		return err
	}
	grid, block := b.grid(l.Rows * a.Heads)
	return b.launch(b.fns[name], grid, block, p)
}

// layerLaunch issues a launch's KV and Q work as one grid (the layer_*
// kernels): the KV part's blocks first, then the Q part's.
func (b *Backend) layerLaunch(l mla.Launch, a *mla.LayerArgs) error {
	kvName, err := kvKernel(a.CacheConfig.Format)
	if err != nil {
		return err
	}
	name := "layer_" + strings.TrimPrefix(kvName, "kv_") + "_q" + a.QFormat.String()
	fn, ok := b.fns[name]
	if !ok {
		return fmt.Errorf("cuda: no fused layer kernel %q", name)
	}
	pkv, err := b.kvParams(l, a)
	if err != nil {
		return err
	}
	pq, err := b.qParams(l, a)
	if err != nil {
		return err
	}
	kvGrid, block := b.grid(l.Rows)
	qGrid, _ := b.grid(l.Rows * a.Heads)
	grid := driver.Dim3{kvGrid[0] + qGrid[0], 1, 1}
	return b.launch(fn, grid, block, pkv, pq, int32(kvGrid[0]))
}

// BF16Sweep rounds n float32 bit patterns base, base+1, ... to bf16 with the
// kernels' conversion into out (2n bytes, n even).
func (b *Backend) BF16Sweep(out mla.Buffer, base uint32, n int) error {
	o, err := span(out, 0, 2*n)
	if err != nil {
		return err
	}
	if n%2 != 0 {
		return fmt.Errorf("cuda: BF16Sweep n = %d must be even", n)
	}
	grid := driver.Dim3{uint32(b.ctx.Props().SMCount * 8), 1, 1}
	return b.ctx.Launch(b.fns["bf16_sweep"], grid, driver.Dim3{256, 1, 1}, 0, b.stream, o, base, uint32(n))
}

// E4M3Sweep converts n float32 bit patterns base, base+1, ... with the
// hardware conversion into out (n bytes, n even).
func (b *Backend) E4M3Sweep(out mla.Buffer, base uint32, n int) error {
	o, err := span(out, 0, n)
	if err != nil {
		return err
	}
	if n%2 != 0 {
		return fmt.Errorf("cuda: E4M3Sweep n = %d must be even", n)
	}
	props := b.ctx.Props()
	grid := driver.Dim3{uint32(props.SMCount * 8), 1, 1}
	return b.ctx.Launch(b.fns["e4m3_sweep"], grid, driver.Dim3{256, 1, 1}, 0, b.stream, o, base, uint32(n))
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
// out as one fused grid (unless Options.SeparateLaunches), and the layer's
// launches are handed to the context's owner thread in one batch instead of
// one hand-over each.
func (b *Backend) RunLayer(ctx context.Context, launches []mla.Launch, a *mla.LayerArgs) error {
	if b.opts.SeparateLaunches {
		return b.ctx.Do(func() error { return mla.RunLaunches(ctx, b, launches, a) })
	}
	return b.ctx.Do(func() error {
		for _, l := range launches {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := b.layerLaunch(l, a); err != nil {
				return fmt.Errorf("cuda: fused %v launch: %w", l, err)
			}
		}
		return nil
	})
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
