package cuda

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The third FP8 GEMM implementation: kernels/cuda/gemm_fp8_wgmma.cu, for
// sm_90a (warpgroup MMA on e4m3, operands brought by the tensor memory
// accelerator through tensor maps). It computes Y^T tiles, W's rows on the
// MMA's M side and up to 128 tokens on its N side, in a persistent grid
// of at most one block a multiprocessor; a split K is finished by the
// kernel's last block of each tile or a cluster of the splits, in split
// order. Three kernel families (cudatune.WGMMAKernel): the wide one (128 W
// rows a unit), the narrow one (64, one consumer warpgroup, its token
// tile narrowed before K is split) and the narrow one with two MMA sums
// in turn; the Use rule or Knobs.WGMMAKernel names which. It runs where
// cudatune.Arch's FP8.WGMMA.Use chooses it (no shape until measured on the
// device) or for every GEMM with Options.GEMMWGMMA; elsewhere than compute
// capability 9.0 it does not exist.

// wgmmaArch is the target of the wgmma program: warpgroup MMA exists only
// in the arch-specific sm_90a.
const wgmmaArch = "sm_90a"

// The wide kernels' shape (gemm_fp8_wgmma.cu's wgm::Cfg<2>): two
// consumer warpgroups and a producer, 128 rows of W a work unit; the
// narrow ones (Cfg<1>) have one consumer warpgroup and 64 rows
// (wgmmaShapeOf).
const (
	wgmmaThreads = 384
	wgmmaRowTile = 128
)

// wgmmaShape is a kernel family's block: threads, W rows a unit, token
// tiles, deepest ring.
type wgmmaShape struct {
	threads, rows int
	tiles         []int
	maxStages     int
	prefix        string // the kernels' names, prefix + token tile
}

// wgmmaShapeOf is kernel family k's shape in the architecture description.
func wgmmaShapeOf(a cudatune.WGMMAArch, k cudatune.WGMMAKernel) (wgmmaShape, error) {
	switch k {
	case cudatune.WGMMAWide:
		return wgmmaShape{threads: wgmmaThreads, rows: wgmmaRowTile, tiles: a.TokenTiles, maxStages: a.MaxStages, prefix: "gemm_fp8_wgmma_bn"}, nil
	case cudatune.WGMMANarrow:
		return wgmmaShape{threads: 256, rows: 64, tiles: a.NarrowTiles, maxStages: a.NarrowMaxStages, prefix: "gemm_fp8_wgmma_n1_bn"}, nil
	case cudatune.WGMMANarrowPipe:
		return wgmmaShape{threads: 256, rows: 64, tiles: a.NarrowPipeTiles, maxStages: a.NarrowMaxStages, prefix: "gemm_fp8_wgmma_n1p_bn"}, nil
	case cudatune.WGMMAWidePipe:
		return wgmmaShape{threads: wgmmaThreads, rows: wgmmaRowTile, tiles: a.WidePipeTiles, maxStages: a.MaxStages, prefix: "gemm_fp8_wgmma_p_bn"}, nil
	}
	return wgmmaShape{}, fmt.Errorf("%w: no wgmma kernel family %v", ErrWGMMAUnavailable, k)
}

// ring is the deepest ring of token tile bn that fits in smemOptin (at
// most maxStages) and the shared memory a block it takes.
func (sh wgmmaShape) ring(bn, smemOptin int) (stages, smem int, err error) {
	fixed := wgmmaSmemBytesRows(sh.rows, bn, 0)
	stages = min(sh.maxStages, (smemOptin-fixed)/(wgmmaSmemBytesRows(sh.rows, bn, 1)-fixed))
	if stages < 2 {
		return 0, 0, fmt.Errorf("%w: %d bytes of shared memory a block hold fewer than 2 stages of token tile %d", ErrWGMMAUnavailable, smemOptin, bn)
	}
	return stages, wgmmaSmemBytesRows(sh.rows, bn, stages), nil
}

// wgmmaKernels are the families loadWGMMA loads.
var wgmmaKernels = []cudatune.WGMMAKernel{cudatune.WGMMAWide, cudatune.WGMMANarrow, cudatune.WGMMANarrowPipe, cudatune.WGMMAWidePipe}

// ErrWGMMAUnavailable: the wgmma GEMM cannot run here (not compute
// capability 9.0, no tensor maps in the driver, or no kernels in the
// architecture description); the error it wraps says which.
var ErrWGMMAUnavailable = errors.New("cuda: the sm_90a wgmma GEMM is unavailable")

// wgmmaScaleBlock is the scale block the kernels are instantiated for
// (gemm_fp8_wgmma.cu's SB: DeepSeek-V4's 128 x 128 weight and 1 x 128
// activation blocks).
const wgmmaScaleBlock = 128

// wgmmaSmemBytes is a block's dynamic shared memory for the wide
// kernels (wgmmaSmemBytesRows).
func wgmmaSmemBytes(bn, stages int) int { return wgmmaSmemBytesRows(wgmmaRowTile, bn, stages) }

// wgmmaSmemBytesRows is a block's dynamic shared memory for `rows` W rows
// a unit, token tile bn and a ring of `stages` stages, as
// gemm_fp8_wgmma.cu lays it out: each stage the W rows and bn token rows
// of 128 bytes, its scales (wgmmaScaleBytes) and its two 8-byte mbarriers,
// each consumer warpgroup's bf16 tile (bn rows of 72 u16), and 1024 bytes
// to align the ring for the 128-byte swizzle.
func wgmmaSmemBytesRows(rows, bn, stages int) int {
	return stages*(rows*128+bn*128+wgmmaScaleBytes(rows, bn)+16) + rows/64*bn*72*2 + 1024
}

// wgmmaScaleBytes is one stage's scales (the kernel's Layout::kScaleStage):
// the bn tokens' x scales and the tile's W scales (rows / wgmmaScaleBlock
// scale rows, at least one) of each of the K block's 128 /
// wgmmaScaleBlock scale blocks, padded to 16 bytes.
func wgmmaScaleBytes(rows, bn int) int {
	subs := 128 / wgmmaScaleBlock
	return (4*(subs*bn+max(1, rows/wgmmaScaleBlock)*subs) + 15) &^ 15
}

// wgmmaPlan is one GEMM's launch of the wgmma kernel; cluster: the splits
// of a unit are one thread-block cluster that finishes the unit through
// distributed shared memory (grid = units x splits, one unit a block).
type wgmmaPlan struct {
	bn, chunks, splits, kbPerSplit, grid, stages, smem int
	cluster                                            bool
	// multicast > 1: clusters of that many blocks sharing the activation
	// tile (one chunk, no split), the persistent grid whole clusters.
	multicast int
	// wcast > 1: clusters of that many blocks, token chunks of one weight
	// tile and K range, sharing the weight tile (the split, if any,
	// finished by the tile's last block), the persistent grid whole
	// clusters; with multicast > 1 too, clusters of wcast x multicast
	// blocks (every chunk of multicast tiles, no split).
	wcast int
}

// planWGMMA picks the token tile (the smallest of a.TokenTiles holding M,
// else the largest, over several chunks), the split of K (N so narrow that
// the units fill at most half the multiprocessors splits until they fill
// every one once, as long as the float32 partials stay within the
// workspace and no larger than the weight; clusters of the splits where
// one wave of them fits, a.MaxClusters), the
// persistent grid and the deepest ring that fits in smemOptin, for the
// wide kernels (planWGMMAKernel).
func planWGMMA(a cudatune.WGMMAArch, m, n, k, sms, smemOptin, partBytes int) (wgmmaPlan, error) {
	return planWGMMAKernel(a, cudatune.WGMMAWide, m, n, k, sms, smemOptin, partBytes)
}

// planWGMMAKernel is planWGMMA for kernel family kern; the narrow
// families (64-row units) first halve the token tile, down to their
// smallest, while the units fill fewer than half the multiprocessors: at
// narrow N more token chunks of the full K keep each block's chain of K
// blocks long where a split would cut it (DeepGEMM's choice at these
// shapes: 2026-12-02-h200-i/deepgemm, V4-Flash [wq_a; wkv] at 128 rows in
// 96 blocks of 64 tokens x 32 weight rows, the full K each). The
// activation is shared (a.Multicast) only by the wide kernels' blocks of
// one chunk; the weights (a.WeightMulticast) by any family's chunks.
func planWGMMAKernel(a cudatune.WGMMAArch, kern cudatune.WGMMAKernel, m, n, k, sms, smemOptin, partBytes int) (wgmmaPlan, error) {
	var p wgmmaPlan
	sh, err := wgmmaShapeOf(a, kern)
	if err != nil {
		return p, err
	}
	if len(sh.tiles) == 0 {
		return p, fmt.Errorf("%w: the architecture description has no %v wgmma token tiles", ErrWGMMAUnavailable, kern)
	}
	if n%sh.rows != 0 {
		return p, fmt.Errorf("cuda: wgmma GEMM: N = %d is not a multiple of the %v kernel's %d rows", n, kern, sh.rows)
	}
	if a.MaxSMs > 0 {
		sms = min(sms, a.MaxSMs)
	}
	ti := len(sh.tiles) - 1
	for i, t := range sh.tiles {
		if t >= m {
			ti = i
			break
		}
	}
	kbn, tiles := k/128, n/sh.rows
	if sh.rows == 64 {
		for ti > 0 && 2*tiles*((m+sh.tiles[ti]-1)/sh.tiles[ti]) < sms &&
			(a.NarrowMaxChunks <= 0 || (m+sh.tiles[ti-1]-1)/sh.tiles[ti-1] <= a.NarrowMaxChunks) {
			ti--
		}
	}
	p.bn = sh.tiles[ti]
	p.chunks = (m + p.bn - 1) / p.bn
	units := tiles * p.chunks
	// Shared weights: the largest power of two up to a.WeightMulticast
	// dividing the chunks whose clusters run at once.
	if wc := a.WeightMulticast; wc > 1 {
		for wc > 1 && (p.chunks%wc != 0 || sh.rows%(8*wc) != 0 || wc >= len(a.MaxClusters) || a.MaxClusters[wc] == 0) {
			wc /= 2
		}
		if wc > 1 {
			p.wcast = wc
		}
	}
	s := 1
	// Splitting pays only below half the multiprocessors: from there on s
	// splits of every unit take as many rounds of the persistent grid as
	// the units do whole, plus the finish.
	if 2*units <= sms && a.MaxSplits != 1 {
		s = min((sms+units-1)/units, kbn, max(1, k/(4*m)), max(1, partBytes/(4*m*n)))
		if p.wcast > 1 {
			s = min(s, max(1, sms/units)) // one round: a cluster's blocks go in step
		}
		if a.MaxSplits > 0 {
			s = min(s, a.MaxSplits)
		}
		// Clusters of the splits where one wave of them fits: the grid is
		// units x splits blocks.
		if c := min(max(1, sms/units), a.ClusterSplits, kbn, max(1, k/(4*m)), s); c > 1 && p.wcast == 0 {
			c = (kbn + (kbn+c-1)/c - 1) / ((kbn + c - 1) / c) // the splits c K ranges make
			if c < len(a.MaxClusters) && units <= a.MaxClusters[c] {
				s, p.cluster = c, true
			}
		}
	}
	p.kbPerSplit = (kbn + s - 1) / s
	p.splits = (kbn + p.kbPerSplit - 1) / p.kbPerSplit
	p.grid = min(units*p.splits, sms)
	if p.cluster {
		p.grid = units * p.splits
	}
	if p.wcast > 1 {
		p.grid = min(units*p.splits, sms, a.MaxClusters[p.wcast]*p.wcast) / p.wcast * p.wcast
		// And the activation: clusters of wcast chunks x multicast tiles
		// (every chunk, no split), at most 8 blocks.
		if mc := a.Multicast; mc > 1 && p.splits == 1 && p.chunks == p.wcast {
			for mc > 1 && (tiles%mc != 0 || p.bn%(8*mc) != 0 || p.wcast*mc > 8 || p.wcast*mc >= len(a.MaxClusters) || a.MaxClusters[p.wcast*mc] == 0) {
				mc /= 2
			}
			if mc > 1 {
				p.multicast = mc
				cl := p.wcast * mc
				p.grid = min(units, sms, a.MaxClusters[cl]*cl) / cl * cl
			}
		}
	}
	if mc := a.Multicast; p.wcast == 0 && sh.rows == wgmmaRowTile && mc > 1 && p.splits == 1 && p.chunks == 1 && p.bn >= max(a.MulticastMinTile, 8*mc) && p.bn%(8*mc) == 0 &&
		units%mc == 0 && mc < len(a.MaxClusters) && a.MaxClusters[mc] > 0 {
		p.multicast = mc
		p.grid = min(units, sms, a.MaxClusters[mc]*mc) / mc * mc
	}
	if p.stages, p.smem, err = sh.ring(p.bn, smemOptin); err != nil {
		return p, err
	}
	// The partial tile [bn][rows + 4] floats (kPartPitch) over the ring.
	if p.cluster && p.bn*(sh.rows+4)*4 > p.stages*(sh.rows*128+p.bn*128) {
		return p, fmt.Errorf("%w: a %d-token partial tile outgrows a %d-stage ring", ErrWGMMAUnavailable, p.bn, p.stages)
	}
	return p, nil
}

// wgmmaState is the loaded wgmma kernels and the tensor maps encoded so
// far.
type wgmmaState struct {
	mod *driver.Module
	fns map[wgmmaFn]*driver.Function // (family, token tile) -> its kernel
	// caps[family] is the family's MaxClusters (clusterCapacity).
	caps map[cudatune.WGMMAKernel][]int
	// counters are the split finish's tile counts, one array a stream (as
	// the partials), zeroed once; the kernel leaves them zeroed.
	counters [streamSlots]driver.DevicePtr
	maps     tensorMaps
}

// wgmmaFn names one kernel: its family and token tile.
type wgmmaFn struct {
	kernel cudatune.WGMMAKernel
	bn     int
}

// tensorMapKey is one operand's map: rows of cols bytes at addr, stride
// bytes apart (0: cols), copied in boxes of 128 bytes x box rows.
type tensorMapKey struct {
	addr                    driver.DevicePtr
	rows, cols, stride, box int
}

// wgmmaCounterBytes holds a count for every unit of a split GEMM: K
// splits only while the units (tiles x chunks) are fewer than the
// multiprocessors.
const wgmmaCounterBytes = 4 << 10

// wgmmaCounterArrays: one counter array a stream (wgmmaState.counters).
const wgmmaCounterArrays = int64(len(wgmmaState{}.counters))

// free releases the counters (the module is unloaded by closeGEMM).
func (w *wgmmaState) free(c *driver.Context) error {
	var errs []error
	for i, p := range w.counters {
		if p != 0 {
			errs = append(errs, c.Free(p))
			w.counters[i] = 0
		}
	}
	return errors.Join(errs...)
}

// maxTensorMaps bounds the cache: a process that allocates operands
// without end re-encodes instead of growing it.
const maxTensorMaps = 4096

// tensorMaps caches the operands' tensor maps of the wgmma GEMMs (the
// FP8 and the bf16 one each keep one).
type tensorMaps struct {
	mu sync.Mutex
	m  map[tensorMapKey]driver.TensorMap
}

// get returns the operand's tensor map (128-byte swizzle, zero outside
// the matrix), encoded once: a GEMM replayed or captured again on the
// same buffers encodes nothing. what names the GEMM in an error.
func (t *tensorMaps) get(c *driver.Context, what string, key tensorMapKey) (driver.TensorMap, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m, ok := t.m[key]; ok {
		return m, nil
	}
	stride := key.stride
	if stride == 0 {
		stride = key.cols
	}
	m, err := c.EncodeTiled(driver.TiledTensor{
		DataType: driver.TensorDataUint8, Addr: key.addr,
		Dims: []uint64{uint64(key.cols), uint64(key.rows)}, Strides: []uint64{uint64(stride)},
		Box: []uint32{128, uint32(key.box)}, Swizzle: driver.Swizzle128B, L2Promotion: driver.L2Promotion256B,
	})
	if err != nil {
		return m, fmt.Errorf("cuda: %s operand map %+v: %w", what, key, err)
	}
	if t.m == nil || len(t.m) >= maxTensorMaps {
		t.m = map[tensorMapKey]driver.TensorMap{}
	}
	t.m[key] = m
	return m, nil
}

// reset forgets every map (their buffers may be freed).
func (t *tensorMaps) reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.m)
}

// tensorMap is tensorMaps.get for the FP8 wgmma GEMM.
func (w *wgmmaState) tensorMap(c *driver.Context, key tensorMapKey) (driver.TensorMap, error) {
	return w.maps.get(c, "wgmma GEMM", key)
}

// loadWGMMA compiles and loads the wgmma kernels once, or says why they
// cannot run here (wrapping ErrWGMMAUnavailable where the device, driver
// or architecture description is the reason; a compile or load failure is
// returned as it is).
func (b *Backend) loadWGMMA() error {
	g := &b.gemm
	g.wgOnce.Do(func() {
		g.wgErr = b.initWGMMA()
		// Its counters are allocated now, or never will be.
		b.workspaceSettled.Add(wgmmaCounterArrays * wgmmaCounterBytes)
	})
	return g.wgErr
}

// wgmmaWanted reports whether InitGEMM loads the wgmma kernel: forced, or
// chosen by the architecture description for some shape.
func (b *Backend) wgmmaWanted() bool {
	w := b.arch.FP8.WGMMA
	return len(w.TokenTiles) > 0 && (b.opts.GEMMWGMMA || len(w.Use) > 0)
}

func (b *Backend) initWGMMA() error {
	g := &b.gemm
	a := b.arch.FP8.WGMMA
	if p := b.ctx.Props(); p.Major != 9 || p.Minor != 0 {
		return fmt.Errorf("%w: sm_90a kernels run on compute capability 9.0, the device is %d.%d", ErrWGMMAUnavailable, p.Major, p.Minor)
	}
	if len(a.TokenTiles) == 0 {
		return fmt.Errorf("%w: the architecture description %s has no wgmma token tiles", ErrWGMMAUnavailable, b.arch.Name)
	}
	w := &wgmmaState{fns: map[wgmmaFn]*driver.Function{}, caps: map[cudatune.WGMMAKernel][]int{}}
	// The driver encodes maps (CUDA 12 and later): try one on the workspace.
	if _, err := w.tensorMap(b.ctx, tensorMapKey{addr: g.parts[0], rows: 1, cols: 128, box: 8}); err != nil {
		return fmt.Errorf("%w: %w", ErrWGMMAUnavailable, err)
	}
	w.maps.reset()
	for i := range w.counters {
		p, err := b.ctx.Alloc(wgmmaCounterBytes)
		if err == nil {
			err = b.ctx.Memset8(p, 0, wgmmaCounterBytes)
		}
		if err != nil {
			return errors.Join(err, w.free(b.ctx))
		}
		w.counters[i] = p
	}
	if err := b.ctx.Synchronize(); err != nil { // the zeros, before any stream reads them
		return errors.Join(err, w.free(b.ctx))
	}
	mod, err := b.compileModule(wgmmaGEMMProgram)
	if err != nil {
		return errors.Join(err, w.free(b.ctx))
	}
	for _, kern := range wgmmaKernels {
		sh, err := wgmmaShapeOf(a, kern)
		if err != nil {
			return errors.Join(err, mod.Unload(), w.free(b.ctx))
		}
		for _, bn := range sh.tiles {
			fn, err := mod.Function(sh.prefix + strconv.Itoa(bn))
			if err == nil {
				var smem int
				if _, smem, err = sh.ring(bn, b.arch.SharedPerBlockOptin); err == nil {
					err = fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, smem)
				}
			}
			if err != nil {
				return errors.Join(err, mod.Unload(), w.free(b.ctx))
			}
			w.fns[wgmmaFn{kern, bn}] = fn
		}
	}
	w.mod = mod
	g.wg = w
	for _, kern := range wgmmaKernels {
		b.clusterCapacity(kern, min(8, max(a.ClusterSplits, a.Multicast, a.WeightMulticast, a.Multicast*a.WeightMulticast)))
	}
	b.arch.FP8.WGMMA.MaxClusters = w.caps[cudatune.WGMMAWide]
	return nil
}

// clusterCapacity asks the driver how many clusters of 2 .. maxSplits
// blocks of the wgmma kernel run at once (the architecture description's
// MaxClusters, which the planner reads); where it cannot say, the split K
// is finished by the tiles' last blocks and no block shares its
// activation tile.
// Each family's is asked of its largest token tile's kernel (the most
// shared memory a block).
func (b *Backend) clusterCapacity(kern cudatune.WGMMAKernel, maxSplits int) {
	w := b.gemm.wg
	a := b.arch.FP8.WGMMA
	delete(w.caps, kern)
	sh, err := wgmmaShapeOf(a, kern)
	if maxSplits < 2 || err != nil || len(sh.tiles) == 0 {
		return
	}
	bn := sh.tiles[len(sh.tiles)-1]
	_, smem, err := sh.ring(bn, b.arch.SharedPerBlockOptin)
	if err != nil {
		return
	}
	caps := make([]int, maxSplits+1)
	for s := 2; s <= maxSplits; s++ {
		n, err := b.ctx.MaxActiveClusters(w.fns[wgmmaFn{kern, bn}], driver.Dim3{uint32(sh.threads), 1, 1}, uint32(smem), driver.Dim3{uint32(s), 1, 1})
		if err != nil {
			b.log.Info().Err(err).Int("blocks", s).Stringer("kernel", kern).Msg("wgmma GEMM: no cluster split finish")
			return
		}
		caps[s] = n
	}
	w.caps[kern] = caps
	b.log.Debug().Ints("clusters", caps).Stringer("kernel", kern).Msg("wgmma GEMM: clusters of 2 .. 8 blocks at once")
}

// wgmmaGEMM runs one GEMM on the wgmma kernel family kern, on the
// backend's stream.
func (b *Backend) wgmmaGEMM(kern cudatune.WGMMAKernel, w, ws, x, xs, y driver.DevicePtr, m, n, k, xsStride, yStride int) error {
	g := &b.gemm
	a := b.arch.FP8.WGMMA
	a.MaxClusters = g.wg.caps[kern]
	p, err := planWGMMAKernel(a, kern, m, n, k, b.arch.SMs, b.arch.SharedPerBlockOptin, gemmPartBytes)
	if err != nil {
		return err
	}
	sh, _ := wgmmaShapeOf(a, kern) // the plan found it
	wBox := sh.rows
	if p.wcast > 1 {
		wBox /= p.wcast // each block of a cluster brings a slice
	}
	tw, err := g.wg.tensorMap(b.ctx, tensorMapKey{addr: w, rows: n, cols: k, box: wBox})
	if err != nil {
		return err
	}
	xBox := p.bn
	if p.multicast > 1 {
		xBox /= p.multicast // each block of a cluster brings a slice
	}
	tx, err := g.wg.tensorMap(b.ctx, tensorMapKey{addr: x, rows: m, cols: k, box: xBox})
	if err != nil {
		return err
	}
	fn := g.wg.fns[wgmmaFn{kern, p.bn}]
	// A split K is finished inside the kernel (the tile's last block adds
	// the partials in split order: split_finish), the path the device
	// verified; gemm_fp8_reduce is not launched for it.
	var part, counters driver.DevicePtr
	if p.splits > 1 && !p.cluster {
		if 4*n/sh.rows*p.chunks > wgmmaCounterBytes {
			return fmt.Errorf("cuda: wgmma GEMM: %d units outgrow the split counters", n/sh.rows*p.chunks)
		}
		part, counters = g.parts[b.streamSlot()], g.wg.counters[b.streamSlot()]
	}
	g.wgmmaRun.Add(1)
	cluster := int32(0)
	if p.cluster {
		cluster = 1
	}
	grid, block := driver.Dim3{uint32(p.grid), 1, 1}, driver.Dim3{uint32(sh.threads), 1, 1}
	args := []any{tw, tx, ws, xs, y, part, counters, int32(m), int32(n), int32(k), int32(xsStride), int32(yStride),
		int32(p.kbPerSplit), int32(p.splits), int32(p.chunks), int32(p.stages), int32(p.smem), cluster, int32(p.multicast), int32(p.wcast)}
	return b.ctx.Do(func() error {
		if p.cluster {
			return b.launchCluster(fn, grid, block, driver.Dim3{uint32(p.splits), 1, 1}, p.smem, args...)
		}
		if p.multicast > 1 && p.wcast <= 1 {
			return b.launchCluster(fn, grid, block, driver.Dim3{uint32(p.multicast), 1, 1}, p.smem, args...)
		}
		if p.wcast > 1 {
			return b.launchCluster(fn, grid, block, driver.Dim3{uint32(p.wcast * max(1, p.multicast)), 1, 1}, p.smem, args...)
		}
		return b.launchShared(fn, grid, block, p.smem, args...)
	})
}

// WGMMACount reports how many GEMMs the wgmma kernel ran.
func (b *Backend) WGMMACount() int64 { return b.gemm.wgmmaRun.Load() }
