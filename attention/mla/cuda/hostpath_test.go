package cuda

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/internal/fakecuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// The host path of an eager layer (mla.RunLayer on this backend: the
// arguments' validation, the hand-over to the driver thread, the fused
// launch's parameters and the launch call), timed and counted without a
// GPU: the backend runs against internal/fakecuda's libcuda, every prologue
// kernel standing in for the fake's kernel of the fused layer signature,
// which runs nothing.

// hostPathBackend is a Backend on the fake driver: no NVRTC, its kernels
// the fake's layer sink. It skips without a C compiler to build the fake,
// and when this process loaded a real driver first.
func hostPathBackend(tb testing.TB) *Backend {
	tb.Helper()
	if err := fakecuda.Use(); err != nil {
		tb.Skip(err.Error())
	}
	if !fakecuda.Active() {
		tb.Skip("the process loads a real libcuda (PROLOGUE_LIBCUDA); the host-path backend needs the fake")
	}
	if err := driver.Available(); err != nil {
		tb.Skipf("the fake driver did not load (run the host-path benchmarks alone: -run '^$'): %v", err)
	}
	require.Equal(tb, abi.Params.Size(), fakecuda.LayerSinkParamsBytes(), "the fake's layer sink copies Params of the kernels' size")
	c, err := driver.Open(0)
	require.NoError(tb, err)
	b := &Backend{ctx: c, knobs: cudatune.Knobs{}.Defaults(), fns: map[string]*driver.Function{}}
	b.layerCalls.New = b.newLayerCall
	tb.Cleanup(func() { require.NoError(tb, c.Close()) })
	mod, err := c.LoadModule(fakecuda.ModuleImage())
	require.NoError(tb, err)
	sink, err := mod.Function(fakecuda.LayerSinkKernel)
	require.NoError(tb, err)
	for _, k := range abi.Kernels() {
		b.fns[k.Name] = sink
	}
	b.indexKernels()
	b.stream, err = c.NewStream()
	require.NoError(tb, err)
	b.main = b.stream
	tb.Cleanup(func() { require.NoError(tb, b.stream.Destroy()) })
	return b
}

// hostPathLayers allocates the layers of a decode batch of a model's shape
// (b=32, MTP 3: 128 rows) and returns their arguments and launches, as
// cmd/bench's eager iteration sets them up.
func hostPathLayers(tb testing.TB, b *Backend, md dsv4.Config) ([]mla.LayerArgs, []mla.Launch) {
	tb.Helper()
	const seqs, seqLen, pages, pageSize, ropePositions = 32, 4, 64, 64, 1024
	rows := seqs * seqLen
	alloc := func(n int) mla.Buffer {
		buf, err := b.Alloc(n)
		require.NoError(tb, err)
		tb.Cleanup(func() { require.NoError(tb, b.Free(buf)) })
		return buf
	}
	meta, err := mla.MetadataLayout(seqs, pages)
	require.NoError(tb, err)
	meta.Buf = alloc(meta.Size)
	rowElems := md.QLoraRank + numerics.HeadDim
	rope := alloc(ropePositions * numerics.RopeDim * 4)
	args := make([]mla.LayerArgs, md.NumLayers)
	for l := range args {
		cfg := kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: pageSize, NumPages: pages, KVScale: 1}
		args[l] = mla.LayerArgs{
			Heads: md.NumHeads, Latent: alloc(rows * rowElems * 2), LatentOffset: md.QLoraRank * 2, LatentStride: rowElems,
			QIn: alloc(rows * md.NumHeads * numerics.HeadDim * 2), QOut: alloc(rows * md.NumHeads * numerics.HeadDim),
			QFormat: mla.QFP8, QScale: 1, KVWeight: alloc(numerics.HeadDim * 4), Eps: numerics.DefaultEps,
			Rope: rope, RopePositions: ropePositions, Cache: alloc(cfg.PoolBytes()), CacheConfig: cfg, Meta: meta,
			Scheduler: metadata.DefaultSchedulerParams(),
		}
	}
	launches := []mla.Launch{{Phase: metadata.Generation, Rows: rows, ValidRows: rows, NumSeqs: seqs, SeqLen: seqLen,
		WriteScheduler: true, FromHeader: true}}
	return args, launches
}

// BenchmarkEagerLayer is one layer of an eager decode iteration (V4-Flash
// and V4-Pro shapes, b=32 MTP 3) as cmd/bench's iteration issues it: from
// the caller's goroutine, one hand-over per layer, the layers in turn.
// Run it alone: go test -run '^$' -bench EagerLayer ./attention/mla/cuda/
func BenchmarkEagerLayer(b *testing.B) {
	be := hostPathBackend(b)
	for _, md := range []dsv4.Config{dsv4.Flash(), dsv4.Pro()} {
		b.Run(md.Name, func(b *testing.B) {
			args, launches := hostPathLayers(b, be, md)
			ctx := context.Background()
			b.ReportAllocs()
			l := 0
			for b.Loop() {
				if err := mla.RunLayer(ctx, be, launches, &args[l]); err != nil {
					b.Fatal(err)
				}
				if l++; l == len(args) {
					l = 0
				}
			}
		})
	}
}

// TestEagerLayerAllocatesNothing: issuing an eager layer (mla.RunLayer
// through the hand-over, its fused launch) allocates nothing, against the
// fake driver in a child process.
func TestEagerLayerAllocatesNothing(t *testing.T) {
	if !fakecuda.Active() {
		fakecuda.RunChild(t, "^TestEagerLayerAllocatesNothing$")
		return
	}
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop entries on purpose")
	}
	be := hostPathBackend(t)
	args, launches := hostPathLayers(t, be, dsv4.Flash())
	ctx := context.Background()
	l := 0
	allocs := testing.AllocsPerRun(200, func() {
		if err := mla.RunLayer(ctx, be, launches, &args[l]); err != nil {
			panic(err)
		}
		l = (l + 1) % len(args)
	})
	require.Zero(t, allocs, "allocations per eager layer")
	// Issued on the driver thread (inside a batch, as the engine issues a
	// layer), too.
	allocs = testing.AllocsPerRun(200, func() {
		if err := be.ctx.Do(func() error { return mla.RunLayer(ctx, be, launches, &args[0]) }); err != nil {
			panic(err)
		}
	})
	require.LessOrEqual(t, allocs, 1.0, "allocations per batched eager layer (the test's own closure)")
}

// TestSeparateLaunchesOnTheFake issues every launch form of a layer on the
// fake driver: the fused layer (RunLayer), the KV and the Q launch alone
// (as SeparateLaunches and the single-kernel callers do), so a parameter
// the driver's packing refuses fails here rather than on the GPU.
func TestSeparateLaunchesOnTheFake(t *testing.T) {
	if !fakecuda.Active() {
		fakecuda.RunChild(t, "^TestSeparateLaunchesOnTheFake$")
		return
	}
	be := hostPathBackend(t)
	mod, err := be.ctx.LoadModule(fakecuda.ModuleImage())
	require.NoError(t, err)
	sink, err := mod.Function(fakecuda.ParamsSinkKernel)
	require.NoError(t, err)
	for _, k := range abi.Kernels() {
		if k.Kind != abi.KindLayer {
			be.fns[k.Name] = sink
		}
	}
	be.indexKernels()
	args, launches := hostPathLayers(t, be, dsv4.Flash())
	ctx := context.Background()
	for _, l := range launches {
		require.NoError(t, be.KVNormRopeStore(ctx, l, &args[0]), "KV launch alone")
		require.NoError(t, be.QNormRopeQuant(ctx, l, &args[0]), "Q launch alone")
	}
	require.NoError(t, mla.RunLayer(ctx, be, launches, &args[0]), "fused layer")
	be.knobs.SeparateLaunches = true
	require.NoError(t, mla.RunLayer(ctx, be, launches, &args[0]), "separate launches")
}

// TestLaunchClusterOnTheFake: launchCluster launches in the cluster shape
// asked for, with PDL and without (Options.NoPDL), and refuses a grid that
// is not a multiple of the cluster before the driver.
func TestLaunchClusterOnTheFake(t *testing.T) {
	if !fakecuda.Active() {
		fakecuda.RunChild(t, "^TestLaunchClusterOnTheFake$")
		return
	}
	be := hostPathBackend(t)
	mod, err := be.ctx.LoadModule(fakecuda.ModuleImage())
	require.NoError(t, err)
	echo, err := mod.Function(fakecuda.ClusterEchoKernel)
	require.NoError(t, err)
	grid, cluster := driver.Dim3{4, 6, 2}, driver.Dim3{2, 3, 1}
	words := 4 * int(grid[0]*grid[1]*grid[2])
	out, err := be.ctx.Alloc(4 * words)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, be.ctx.Free(out)) })
	var want []uint32
	for z := range grid[2] {
		for y := range grid[1] {
			for x := range grid[0] {
				rank := x%cluster[0] + cluster[0]*(y%cluster[1]+cluster[1]*(z%cluster[2]))
				want = append(want, cluster[0], cluster[1], cluster[2], (rank+1)%(cluster[0]*cluster[1]*cluster[2]))
			}
		}
	}
	for _, noPDL := range []bool{false, true} {
		be.opts.NoPDL = noPDL
		require.NoError(t, be.ctx.Memset8(out, 0xa5, 4*words), "poison")
		require.NoError(t, be.launchCluster(echo, grid, driver.Dim3{64, 1, 1}, cluster, 0, out), "NoPDL %v", noPDL)
		require.NoError(t, be.stream.Synchronize())
		got := make([]uint32, words)
		require.NoError(t, be.ctx.DtoH(driver.AsBytes(got), out))
		require.Equal(t, want, got, "NoPDL %v", noPDL)
	}
	err = be.launchCluster(echo, driver.Dim3{5, 6, 2}, driver.Dim3{64, 1, 1}, cluster, 0, out)
	require.ErrorIs(t, err, driver.ErrClusterShape)
}
