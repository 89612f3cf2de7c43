package cuda

import (
	"errors"
	"fmt"
	"sync"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The projection GEMM's sm_90a implementation: kernels/cuda/gemm_bf16_wgmma.cu
// (warpgroup MMA on bf16, W and X brought by the tensor memory accelerator
// into a shared-memory ring, float32 out). Like the FP8 wgmma GEMM
// (gemm_wgmma.go) it computes Y^T tiles, 128 W rows on the MMA's M side
// and up to 128 tokens on its N side, in a persistent grid of at most one
// block a multiprocessor; N too narrow to fill the device splits K, the
// splits added in split order by gemm_bf16_mma_reduce, by each unit's last
// block, or across a thread-block cluster (cudatune's BF16.WGMMA.Finish,
// Knobs.BF16WGMMAFinish). It runs where Knobs.BF16WGMMAMaxRows or the
// architecture description's BF16.WGMMA.Use choose it, or for every GEMM
// with the path forced; elsewhere than compute capability 9.0 it does not
// exist.

// ErrBF16WGMMAUnavailable: the sm_90a bf16 GEMM cannot run here (not
// compute capability 9.0, no tensor maps in the driver, or no token tiles
// in the architecture description); the error it wraps says which.
var ErrBF16WGMMAUnavailable = errors.New("cuda: the sm_90a bf16 wgmma GEMM is unavailable")

// bf16WGMMACounterBytes holds a count for every unit of a split GEMM
// finished by its last block: K splits only while the units are at most
// half the multiprocessors.
const bf16WGMMACounterBytes = 4 << 10

// bf16WGMMASmemBytes is a block's dynamic shared memory for token tile bn
// and a ring of `stages` stages, as gemm_bf16_wgmma.cu lays it out: each
// stage 128 W rows and bn token rows of 128 bytes and its two 8-byte
// mbarriers, and 1024 bytes to align the ring for the 128-byte swizzle.
func bf16WGMMASmemBytes(bn, stages int) int {
	return stages*((abi.BF16WGMMARowTile+bn)*128+16) + 1024
}

// bf16WGMMAChoice is what the knobs choose of a plan (zero: the
// planner's own): the finish (Knobs.BF16WGMMAFinish), the most splits
// (Knobs.BF16WGMMAMaxSplits), the largest token tile
// (Knobs.BF16WGMMAMaxTile), the deepest ring (Knobs.BF16WGMMAMaxStages)
// and the L2 prefetch of W (Knobs.BF16WGMMAL2Prefetch).
type bf16WGMMAChoice struct {
	finish, maxSplits, maxTile, maxStages int
	l2Prefetch                            int // Knobs.BF16WGMMAL2Prefetch: 0 the architecture's, > 0 on, < 0 off
}

// bf16WGMMAPlan is one GEMM's launch of the kernel.
type bf16WGMMAPlan struct {
	bn, tiles, chunks, splits, kbPerSplit, grid, stages, smem int
	finish                                                    int // abi.BF16WGMMAFinish*, with splits > 1
	l2Prefetch                                                bool
}

// planBF16WGMMA picks the token tile (the smallest of a.TokenTiles, up to
// o.maxTile where positive, holding M, else the largest, over several
// chunks), the deepest ring that fits in smemOptin (at most o.maxStages
// where positive), the split of K (where the units fill at most half the
// multiprocessors, as many splits as keep one wave of blocks on the
// device, as long as the float32 partials stay within the workspace and no
// larger than the weight; at most o.maxSplits where positive), the finish
// (o.finish, or a.Finish when 0; clusters only where at most 8 splits make
// one wave of clusters, a.MaxClusters, and their partial tiles fit the
// ring, else the unit's last block) and the persistent grid.
func planBF16WGMMA(a cudatune.BF16WGMMAArch, o bf16WGMMAChoice, m, n, k, sms, smemOptin, partBytes int) (bf16WGMMAPlan, error) {
	var p bf16WGMMAPlan
	tiles := a.TokenTiles
	for len(tiles) > 1 && o.maxTile > 0 && tiles[len(tiles)-1] > o.maxTile {
		tiles = tiles[:len(tiles)-1]
	}
	if len(tiles) == 0 {
		return p, fmt.Errorf("%w: the architecture description has no bf16 wgmma token tiles", ErrBF16WGMMAUnavailable)
	}
	finish, maxSplits := o.finish, o.maxSplits
	if finish == 0 {
		finish = a.Finish
	}
	p.bn = tiles[len(tiles)-1]
	for _, t := range tiles {
		if t >= m {
			p.bn = t
			break
		}
	}
	fixed := bf16WGMMASmemBytes(p.bn, 0)
	p.stages = min(a.MaxStages, (smemOptin-fixed)/(bf16WGMMASmemBytes(p.bn, 1)-fixed))
	if o.maxStages > 0 {
		p.stages = min(p.stages, o.maxStages)
	}
	if p.stages < 2 {
		return p, fmt.Errorf("%w: %d bytes of shared memory a block hold fewer than 2 stages of token tile %d", ErrBF16WGMMAUnavailable, smemOptin, p.bn)
	}
	p.smem = bf16WGMMASmemBytes(p.bn, p.stages)
	p.l2Prefetch = o.l2Prefetch > 0 || o.l2Prefetch == 0 && a.L2Prefetch
	p.chunks = (m + p.bn - 1) / p.bn
	p.tiles = (n + abi.BF16WGMMARowTile - 1) / abi.BF16WGMMARowTile
	kbn := k / abi.BF16WGMMAStageK
	units := p.tiles * p.chunks
	s := 1
	// Splitting pays only below half the multiprocessors: from there on s
	// splits of every unit take as many rounds of the persistent grid as
	// the units do whole, plus the finish. Whole waves: s units a tile
	// never outnumber the multiprocessors.
	if 2*units <= sms {
		s = min(sms/units, kbn, max(1, k/(2*m)))
		if maxSplits > 0 {
			s = min(s, maxSplits)
		}
	}
	splitsOf := func(s int) (per, splits int) {
		per = (kbn + s - 1) / s
		return per, (kbn + per - 1) / per
	}
	p.finish = finish
	if s > 1 && finish == abi.BF16WGMMAFinishCluster {
		// At most 8 splits (the portable cluster), one wave of clusters,
		// the partial tile within the ring.
		fits := p.bn*(abi.BF16WGMMARowTile+4)*4 <= p.stages*(abi.BF16WGMMARowTile+p.bn)*128
		if per, c := splitsOf(min(s, 8)); fits && c > 1 && c < len(a.MaxClusters) && units <= a.MaxClusters[c] {
			p.kbPerSplit, p.splits, p.grid = per, c, units*c
		} else {
			p.finish = abi.BF16WGMMAFinishLast
		}
	}
	if p.splits == 0 {
		s = min(s, max(1, partBytes/(4*m*n))) // the partials fit the workspace
		p.kbPerSplit, p.splits = splitsOf(s)
		p.grid = min(units*p.splits, sms)
	}
	if p.splits == 1 {
		p.finish = 0
	}
	return p, nil
}

// bf16WGMMAState is the loaded kernels, the last-block finish's counters
// (one array a stream, zeroed once; the kernel leaves them zeroed) and the
// tensor maps encoded so far.
type bf16WGMMAState struct {
	once     sync.Once
	err      error
	mod      *driver.Module
	byTile   map[int]*driver.Function // token tile -> gemm_bf16_wgmma_bn<T>
	counters [streamSlots]driver.DevicePtr
	maps     tensorMaps
}

// tensorMap is tensorMaps.get for the bf16 wgmma GEMM.
func (w *bf16WGMMAState) tensorMap(c *driver.Context, key tensorMapKey) (driver.TensorMap, error) {
	return w.maps.get(c, "bf16 wgmma GEMM", key)
}

// free releases the counters and unloads the module.
func (w *bf16WGMMAState) free(c *driver.Context) error {
	var errs []error
	for i, p := range w.counters {
		if p != 0 {
			errs = append(errs, c.Free(p))
			w.counters[i] = 0
		}
	}
	if w.mod != nil {
		errs = append(errs, w.mod.Unload())
		w.mod = nil
	}
	return errors.Join(errs...)
}

// bf16WGMMAWanted reports whether InitBF16GEMM loads the kernel: the knob
// or the architecture description chooses it for some shape.
func (b *Backend) bf16WGMMAWanted() bool {
	w := b.arch.BF16.WGMMA
	return len(w.TokenTiles) > 0 && (b.knobs.BF16WGMMAMaxRows > 0 || b.knobs.BF16WGMMAMaxRows == 0 && len(w.Use) > 0)
}

// loadBF16WGMMA compiles and loads the kernels once (InitBF16GEMM first),
// or says why they cannot run here (wrapping ErrBF16WGMMAUnavailable where
// the device, driver or architecture description is the reason).
func (b *Backend) loadBF16WGMMA() error {
	w := &b.bf16.wg
	w.once.Do(func() {
		w.err = b.initBF16WGMMA()
		if b.bf16WGMMAWanted() { // workspaceBytes counted them
			b.workspaceSettled.Add(int64(len(w.counters)) * bf16WGMMACounterBytes) // allocated now, or never
		}
	})
	return w.err
}

func (b *Backend) initBF16WGMMA() error {
	w := &b.bf16.wg
	a := b.arch.BF16.WGMMA
	if p := b.ctx.Props(); p.Major != 9 || p.Minor != 0 {
		return fmt.Errorf("%w: sm_90a kernels run on compute capability 9.0, the device is %d.%d", ErrBF16WGMMAUnavailable, p.Major, p.Minor)
	}
	if len(a.TokenTiles) == 0 {
		return fmt.Errorf("%w: the architecture description %s has no bf16 wgmma token tiles", ErrBF16WGMMAUnavailable, b.arch.Name)
	}
	if b.bf16.mmaReduce == nil {
		return fmt.Errorf("%w: the split-K reduction (gemm_bf16_mma_reduce) is not loaded: %w", ErrBF16WGMMAUnavailable, b.bf16.mmaErr)
	}
	w.byTile = map[int]*driver.Function{}
	// The driver encodes maps (CUDA 12 and later): try one on the workspace.
	if _, err := w.tensorMap(b.ctx, tensorMapKey{addr: b.bf16.parts[0], rows: 1, cols: 128, stride: 128, box: 8}); err != nil {
		return fmt.Errorf("%w: %w", ErrBF16WGMMAUnavailable, err)
	}
	w.maps.reset()
	for i := range w.counters {
		p, err := b.ctx.Alloc(bf16WGMMACounterBytes)
		if err == nil {
			err = b.ctx.Memset8(p, 0, bf16WGMMACounterBytes)
		}
		if err != nil {
			return errors.Join(err, w.free(b.ctx))
		}
		w.counters[i] = p
	}
	if err := b.ctx.Synchronize(); err != nil { // the zeros, before any stream reads them
		return errors.Join(err, w.free(b.ctx))
	}
	mod, err := b.compileModule(bf16WGMMAProgram)
	if err != nil {
		return errors.Join(err, w.free(b.ctx))
	}
	w.mod = mod
	for _, bn := range a.TokenTiles {
		fn, err := mod.Function(abi.BF16WGMMAKernel(bn))
		if err == nil {
			var p bf16WGMMAPlan
			if p, err = planBF16WGMMA(a, bf16WGMMAChoice{}, bn, abi.BF16WGMMARowTile, abi.BF16WGMMAStageK, b.arch.SMs, b.arch.SharedPerBlockOptin, bf16MMAPartBytes); err == nil {
				err = fn.SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, p.smem)
			}
		}
		if err != nil {
			return errors.Join(err, w.free(b.ctx))
		}
		w.byTile[bn] = fn
	}
	b.bf16ClusterCapacity()
	return nil
}

// bf16ClusterCapacity asks the driver how many clusters of 2 .. 8 blocks
// of the kernel (its largest token tile, the most shared memory) run at
// once: the architecture description's BF16.WGMMA.MaxClusters, which the
// planner reads; where it cannot say, no split K is finished in clusters.
func (b *Backend) bf16ClusterCapacity() {
	a := &b.arch.BF16.WGMMA
	a.MaxClusters = nil
	bn := a.TokenTiles[len(a.TokenTiles)-1]
	p, err := planBF16WGMMA(*a, bf16WGMMAChoice{}, bn, abi.BF16WGMMARowTile, abi.BF16WGMMAStageK, b.arch.SMs, b.arch.SharedPerBlockOptin, bf16MMAPartBytes)
	if err != nil {
		return
	}
	caps := make([]int, 9)
	for s := 2; s <= 8; s++ {
		n, err := b.ctx.MaxActiveClusters(b.bf16.wg.byTile[bn], driver.Dim3{abi.BF16WGMMAThreads, 1, 1}, uint32(p.smem), driver.Dim3{uint32(s), 1, 1})
		if err != nil {
			b.log.Info().Err(err).Int("blocks", s).Msg("bf16 wgmma GEMM: no cluster split finish")
			return
		}
		caps[s] = n
	}
	a.MaxClusters = caps
	b.log.Debug().Ints("clusters", caps).Msg("bf16 wgmma GEMM: clusters of 2 .. 8 blocks at once")
}

// bf16WGMMASupports reports whether the kernel runs a GEMM of rows x n
// outputs from k inputs: nil, or why not. Validate's alignments (X's
// offset and row stride whole 16 bytes) are the tensor maps'.
func (b *Backend) bf16WGMMASupports(rows, n, k int) error {
	w := &b.bf16.wg
	switch {
	case w.mod == nil && w.err != nil:
		return w.err
	case w.mod == nil:
		return fmt.Errorf("%w: not loaded", ErrBF16WGMMAUnavailable)
	case k%abi.BF16WGMMAStageK != 0:
		return fmt.Errorf("cuda: the bf16 wgmma GEMM needs K a multiple of %d, K = %d", abi.BF16WGMMAStageK, k)
	case 2*k > 1<<31-1 || rows > 1<<31-1-abi.BF16WGMMARowTile:
		return fmt.Errorf("cuda: the bf16 wgmma GEMM's tensor maps do not reach %d rows x %d", rows, k)
	}
	return nil
}

// bf16WGMMAPlan is the kernel's plan for a GEMM on this backend.
func (b *Backend) bf16WGMMAPlan(rows, n, k int) (bf16WGMMAPlan, error) {
	o := bf16WGMMAChoice{finish: b.knobs.BF16WGMMAFinish, maxSplits: b.knobs.BF16WGMMAMaxSplits, maxTile: b.knobs.BF16WGMMAMaxTile, maxStages: b.knobs.BF16WGMMAMaxStages,
		l2Prefetch: b.knobs.BF16WGMMAL2Prefetch}
	return planBF16WGMMA(b.arch.BF16.WGMMA, o, rows, n, k, b.arch.SMs, b.arch.SharedPerBlockOptin, bf16MMAPartBytes)
}

// bf16WGMMAChosen reports whether the automatic path runs the kernel for
// a GEMM of rows x n outputs (the knob, else the architecture's rules).
func (b *Backend) bf16WGMMAChosen(rows, n int) bool {
	switch k := b.knobs.BF16WGMMAMaxRows; {
	case k < 0:
		return false
	case k > 0:
		return rows <= k
	}
	return b.arch.BF16.WGMMA.Chosen(rows, n)
}

// bf16WGMMAParams packs the kernel's BF16WGMMAParams for plan p.
func bf16WGMMAParams(y, part, counters driver.DevicePtr, a *mla.BF16GEMMArgs, p bf16WGMMAPlan) ([]byte, error) {
	g := abi.BF16WGMMAParams.Pack()
	g.Ptr(abi.BF16WGMMAY, uint64(y))
	g.Ptr(abi.BF16WGMMAPart, uint64(part))
	g.Ptr(abi.BF16WGMMACounters, uint64(counters))
	g.I32(abi.BF16WGMMAM, int32(a.Rows))
	g.I32(abi.BF16WGMMAN, int32(a.N))
	g.I32(abi.BF16WGMMAK, int32(a.K))
	g.I32(abi.BF16WGMMAYStride, int32(a.YStride))
	g.I32(abi.BF16WGMMAKBPerSplit, int32(p.kbPerSplit))
	g.I32(abi.BF16WGMMASplits, int32(p.splits))
	g.I32(abi.BF16WGMMAChunks, int32(p.chunks))
	g.I32(abi.BF16WGMMAStages, int32(p.stages))
	g.I32(abi.BF16WGMMASmemBytes, int32(p.smem))
	g.I32(abi.BF16WGMMAFinish, int32(p.finish))
	pf := int32(0)
	if p.l2Prefetch {
		pf = 1
	}
	g.I32(abi.BF16WGMMAL2Prefetch, pf)
	return g.Bytes()
}

// bf16WGMMA enqueues the kernel and, with a split K finished by the
// reduction launch, gemm_bf16_mma_reduce after it. Everything that can
// refuse (the plan, the maps, the parameters) runs before the first launch.
func (b *Backend) bf16WGMMA(op bf16Operands, a *mla.BF16GEMMArgs) error {
	g := &b.bf16
	p, err := b.bf16WGMMAPlan(a.Rows, a.N, a.K)
	if err != nil {
		return err
	}
	tw, err := g.wg.tensorMap(b.ctx, tensorMapKey{addr: op.w, rows: a.N, cols: 2 * a.K, stride: 2 * a.K, box: abi.BF16WGMMARowTile})
	if err != nil {
		return err
	}
	tx, err := g.wg.tensorMap(b.ctx, tensorMapKey{addr: op.x, rows: a.Rows, cols: 2 * a.K, stride: 2 * a.XStride, box: p.bn})
	if err != nil {
		return err
	}
	slot := b.streamSlot()
	var part, counters driver.DevicePtr
	if p.splits > 1 && p.finish != abi.BF16WGMMAFinishCluster {
		part = g.parts[slot]
		if 4*int64(p.splits)*int64(a.Rows)*int64(a.N) > bf16MMAPartBytes {
			return fmt.Errorf("cuda: bf16 wgmma GEMM: %d splits of %d x %d partials outgrow the workspace", p.splits, a.Rows, a.N)
		}
		if p.finish == abi.BF16WGMMAFinishLast {
			if 4*p.tiles*p.chunks > bf16WGMMACounterBytes {
				return fmt.Errorf("cuda: bf16 wgmma GEMM: %d units outgrow the split counters", p.tiles*p.chunks)
			}
			counters = g.wg.counters[slot]
		}
	}
	params, err := bf16WGMMAParams(op.y, part, counters, a, p)
	if err != nil {
		return err
	}
	var reduce []byte
	if p.splits > 1 && p.finish == abi.BF16WGMMAFinishReduce {
		if reduce, err = splitKParams(part, op.y, a.Rows, a.N, a.YStride, p.splits); err != nil {
			return err
		}
	}
	fn := g.wg.byTile[p.bn]
	grid, block := driver.Dim3{uint32(p.grid), 1, 1}, driver.Dim3{abi.BF16WGMMAThreads, 1, 1}
	g.wgRun.Add(1)
	return b.ctx.Do(func() error {
		var err error
		if p.splits > 1 && p.finish == abi.BF16WGMMAFinishCluster {
			err = b.launchCluster(fn, grid, block, driver.Dim3{uint32(p.splits), 1, 1}, p.smem, tw, tx, driver.Bytes(params))
		} else {
			err = b.launchShared(fn, grid, block, p.smem, tw, tx, driver.Bytes(params))
		}
		if err != nil || reduce == nil {
			return err
		}
		return b.launch(g.mmaReduce, splitKGrid(a.Rows, a.N), driver.Dim3{abi.SplitKThreads, 1, 1}, driver.Bytes(reduce))
	})
}

// BF16WGMMAError is why the sm_90a bf16 GEMM is not in use (nil when it
// is loaded), after InitBF16GEMM.
func (b *Backend) BF16WGMMAError() error {
	w := &b.bf16.wg
	if w.mod == nil && w.err == nil {
		return fmt.Errorf("%w: not loaded (neither Knobs.BF16WGMMAMaxRows nor the architecture description choose it)", ErrBF16WGMMAUnavailable)
	}
	return w.err
}

// BF16WGMMACount reports how many projection GEMMs the sm_90a kernel ran.
func (b *Backend) BF16WGMMACount() int64 { return b.bf16.wgRun.Load() }
