package cuda_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/gemm"
	"github.com/dsv4mla/prologue/internal/cudatune"
)

var (
	bf16Times         = flag.Bool("bf16.times", false, "TestBF16GEMMTimes: time the projection GEMM's implementations at V4-Flash and V4-Pro shapes")
	bf16TimesRows     = flag.String("bf16.times.rows", "1,8,32,64,128", "TestBF16GEMMTimes: the batch sizes, comma-separated")
	bf16TimesVariants = flag.String("bf16.times.variants", "d2,d2/s16,d2f,d2f/s16,d4,d8,d4f,d8f,d8f/s16,d4w,d4wf,cublaslt",
		"TestBF16GEMMTimes: the implementations, comma-separated: dD[w][f][/bB] (the tensor-core kernel of Knobs.BF16MMADepth D, w: 32 W rows a warp, f: its split K finished in the kernel, the split aiming at B blocks a multiprocessor, at most S splits), wg[/fF][/sS][/tT][/rR][/p] (the sm_90a wgmma kernel, its split K finished by F: 1 the reduction, 2 the last block, 3 clusters; at most S splits; token tiles of at most T; a ring of at most R stages; p: W prefetched into L2) or cublaslt")
)

// bf16TimesShapes are the projection GEMMs of the engine at decode: the
// ratio-4 layer's one fused projection (2624 outputs; 2048, [wkv; wgate]
// alone, without the indexer) and ratio 128's [wkv; wgate] (1024) at
// V4-Flash's hidden size 4096 and V4-Pro's 7168, and weights_proj alone
// (64) at 7168.
var bf16TimesShapes = []struct {
	name string
	n, k int
}{
	{"flash/r4-fused", 2624, 4096}, {"flash/r4", 2048, 4096}, {"flash/r128", 1024, 4096},
	{"pro/r4-fused", 2624, 7168}, {"pro/r4", 2048, 7168}, {"pro/r128", 1024, 7168}, {"pro/weights_proj", 64, 7168},
}

// bf16TimesVariant parses one -bf16.times.variants entry; wg[/fF][/sS][/tT][/rR][/p] is
// the sm_90a kernel (Knobs.BF16WGMMAMaxRows set), its split K finished the
// way F names (Knobs.BF16WGMMAFinish: 1 the reduction launch, 2 the unit's
// last block, 3 clusters; default the architecture's), at most S splits
// (Knobs.BF16WGMMAMaxSplits), token tiles of at most T rows
// (Knobs.BF16WGMMAMaxTile), a ring of at most R stages
// (Knobs.BF16WGMMAMaxStages), p: W prefetched into L2
// (Knobs.BF16WGMMAL2Prefetch).
func bf16TimesVariant(v string) (cudatune.Knobs, bool, error) {
	if v == "cublaslt" {
		return cudatune.Knobs{}, true, nil
	}
	if h, ok := strings.CutPrefix(v, "cublaslt/h"); ok {
		n, err := strconv.Atoi(h)
		if err != nil || n < 1 {
			return cudatune.Knobs{}, false, fmt.Errorf("-bf16.times.variants: %q is not cublaslt/hN (the heuristic's N-th result)", v)
		}
		return cudatune.Knobs{CuBLASLtBF16Heuristic: n}, true, nil
	}
	var k cudatune.Knobs
	if w, ok := strings.CutPrefix(v, "wg"); ok {
		k.BF16WGMMAMaxRows = math.MaxInt32
		if w == "" {
			return k, false, nil
		}
		for _, part := range strings.Split(strings.TrimPrefix(w, "/"), "/") {
			n, err := strconv.Atoi(part[min(1, len(part)):])
			switch {
			case part == "p" && strings.HasPrefix(w, "/") && k.BF16WGMMAL2Prefetch == 0:
				k.BF16WGMMAL2Prefetch = 1
				continue
			case !strings.HasPrefix(w, "/") || err != nil:
			case part[0] == 'f' && n >= 1 && n <= 3 && k.BF16WGMMAFinish == 0:
				k.BF16WGMMAFinish = n
				continue
			case part[0] == 's' && n >= 1 && k.BF16WGMMAMaxSplits == 0:
				k.BF16WGMMAMaxSplits = n
				continue
			case part[0] == 't' && n >= 8 && k.BF16WGMMAMaxTile == 0:
				k.BF16WGMMAMaxTile = n
				continue
			case part[0] == 'r' && n >= 2 && k.BF16WGMMAMaxStages == 0:
				k.BF16WGMMAMaxStages = n
				continue
			}
			return k, false, fmt.Errorf("-bf16.times.variants: %q is not wg[/fF][/sS][/tT][/rR][/p] (F 1, 2 or 3)", v)
		}
		return k, false, nil
	}
	v, sp, _ := strings.Cut(v, "/s")
	if sp != "" {
		var err error
		if k.BF16MMAMaxSplits, err = strconv.Atoi(sp); err != nil {
			return k, false, fmt.Errorf("-bf16.times.variants: %q is not dD[w][f][/bB][/sS] or cublaslt", v)
		}
	}
	d, b, _ := strings.Cut(strings.TrimPrefix(v, "d"), "/b")
	for strings.HasSuffix(d, "f") || strings.HasSuffix(d, "w") {
		if strings.HasSuffix(d, "f") {
			d, k.BF16MMAReduce = strings.TrimSuffix(d, "f"), 2
		} else {
			d, k.BF16MMAWarpRows = strings.TrimSuffix(d, "w"), 32
		}
	}
	var err error
	if k.BF16MMADepth, err = strconv.Atoi(d); err != nil || !strings.HasPrefix(v, "d") {
		return k, false, fmt.Errorf("-bf16.times.variants: %q is not dD[w][f][/bB][/sS] or cublaslt", v)
	}
	if b != "" {
		if k.BF16MMABlocksPerSM, err = strconv.Atoi(b); err != nil {
			return k, false, fmt.Errorf("-bf16.times.variants: %q is not dD[w][f][/bB][/sS] or cublaslt", v)
		}
	}
	return k, false, nil
}

// TestBF16GEMMTimes prints device times of the projection GEMM at the
// engine's decode shapes for each implementation of -bf16.times.variants:
// "cold" with L2 flushed before each call (a 256 MiB memset), "b2b" back
// to back on the same inputs, both replayed from CUDA graphs of 20 calls
// (no host launch cost; the median of three launches), the weights' GB/s
// at the cold time and its share of the 1 GiB device-to-device copy rate
// measured first in the same process. Every tensor-core variant is forced
// onto the tensor-core path whatever the rows (BF16MMAMaxRows chooses it
// in production). Run with -bf16.times.
func TestBF16GEMMTimes(t *testing.T) {
	if !*bf16Times {
		t.Skip("run with -bf16.times")
	}
	backend(t)
	var ms []int
	for _, f := range strings.Split(*bf16TimesRows, ",") {
		m, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err, "-bf16.times.rows")
		ms = append(ms, m)
	}
	copyRate := deviceCopyGBps(t, backend(t))
	// One set of operands a shape (the most rows; a GEMM of m rows reads
	// the first m), drawn once and uploaded to each variant's backend.
	most := slices.Max(ms)
	ops := make([]*gemm.BF16Operands, len(bf16TimesShapes))
	for i, s := range bf16TimesShapes {
		ops[i] = mlatest.RandomBF16Operands(rand.New(rand.NewPCG(uint64(s.n), uint64(s.k))), mlatest.BF16GEMMCase{Rows: most, N: s.n, K: s.k})
	}
	fmt.Printf("BF16TIMES copy 1 GiB (cuMemcpyDtoD, read + write): %.0f GB/s\n", copyRate)
	ctx := context.Background()
	for _, v := range strings.Split(*bf16TimesVariants, ",") {
		knobs, lt, err := bf16TimesVariant(strings.TrimSpace(v))
		require.NoError(t, err)
		b, err := cuda.NewTuned(cuda.Options{}, knobs)
		require.NoError(t, err)
		require.NoError(t, b.InitBF16GEMM())
		path := "mma"
		wg := knobs.BF16WGMMAMaxRows > 0
		if wg {
			path = "wgmma"
			if b.BF16WGMMAError() != nil {
				t.Logf("sm_90a wgmma kernel unavailable: %v", b.BF16WGMMAError())
				require.NoError(t, b.Close())
				continue
			}
		} else if lt {
			path = "cublaslt"
			if b.CuBLASLtError() != nil {
				t.Logf("cuBLASLt unavailable: %v", b.CuBLASLtError())
				require.NoError(t, b.Close())
				continue
			}
		} else if b.BF16MMAError() != nil {
			t.Logf("tensor-core kernel unavailable: %v", b.BF16MMAError())
			require.NoError(t, b.Close())
			continue
		}
		b.SetBF16GEMMPath(path)
		flush, err := b.Alloc(256 << 20)
		require.NoError(t, err)
		for i, s := range bf16TimesShapes {
			x, w, err := mlatest.UploadBF16Operands(b, ops[i], 0)
			require.NoError(t, err)
			for _, m := range ms {
				c := mlatest.BF16GEMMCase{Rows: m, N: s.n, K: s.k}
				if lt && b.CuBLASLtSupportsBF16(m, s.n, s.k, s.k, s.n) != nil {
					fmt.Printf("BF16TIMES %-8s %-17s m%-4d refused by cuBLASLt\n", v, s.name, m)
					continue
				}
				y, err := b.Alloc(mlatest.BF16GEMMYBytes(c))
				require.NoError(t, err)
				args := mlatest.BF16GEMMArgs(c, x, w, y)
				require.NoError(t, b.BF16GEMM(ctx, args)) // warm-up: plans, first launch
				gemmCall := func() error { return b.BF16GEMM(ctx, args) }
				fill := func() error { return b.Fill(flush, 0, 256<<20, byte(m)) }
				b2b := timeBF16Graph(t, b, gemmCall)
				cold := timeBF16Graph(t, b, func() error {
					if err := fill(); err != nil {
						return err
					}
					return gemmCall()
				}) - timeBF16Graph(t, b, fill)
				plan := "cublaslt"
				if wg {
					plan = b.BF16WGMMAPlanOf(m, s.n, s.k)
				} else if !lt {
					tiles, splits, chunks, shared := b.BF16MMAPlanOf(m, s.n, s.k)
					plan = fmt.Sprintf("%s grid %dx%dx%d shared %d", b.BF16MMAKernelName(), tiles, splits, chunks, shared)
				}
				us := float64(cold) / float64(time.Microsecond)
				gbps := float64(2*s.n*s.k) / us / 1e3
				fmt.Printf("BF16TIMES %-8s %-17s m%-4d cold %7.2f us  b2b %7.2f us  cold %5.0f GB/s  %5.1f%% of copy  floor %5.2f us  %s\n",
					v, s.name, m, us, float64(b2b)/float64(time.Microsecond), gbps, 100*gbps/copyRate,
					float64(2*s.n*s.k)/copyRate/1e3, plan)
				require.NoError(t, b.Free(y))
			}
			for _, buf := range []mla.Buffer{x, w} {
				require.NoError(t, b.Free(buf))
			}
		}
		require.NoError(t, b.Free(flush))
		require.NoError(t, b.Close())
	}
}

// timeBF16Graph is the device time of one call of f: a graph of 20 calls,
// launched once to warm up, then the median of three timed launches, over
// 20.
func timeBF16Graph(t *testing.T, b *cuda.Backend, f func() error) time.Duration {
	const reps = 20
	g, err := b.Capture(func() error {
		for range reps {
			if err := f(); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, g.Launch())
	var ds []time.Duration
	for range 3 {
		d, err := b.Time(context.Background(), g.Launch)
		require.NoError(t, err)
		ds = append(ds, d)
	}
	slices.Sort(ds)
	return ds[1] / reps
}

// deviceCopyGBps is the device-to-device copy rate, read plus write, in
// GB/s: 1 GiB by cuMemcpyDtoD, ten back to back, the median of five rounds
// after three to warm up.
func deviceCopyGBps(t *testing.T, b *cuda.Backend) float64 {
	const n = 1 << 30
	src, err := b.Alloc(n)
	require.NoError(t, err)
	defer b.Free(src)
	dst, err := b.Alloc(n)
	require.NoError(t, err)
	defer b.Free(dst)
	sp, dp := src.(*cuda.Buffer).Ptr(), dst.(*cuda.Buffer).Ptr()
	var rates []float64
	for i := range 8 {
		d, err := b.Time(context.Background(), func() error {
			return b.Context().Do(func() error {
				for range 10 {
					if err := b.Context().DtoDAsync(dp, sp, n, b.Stream()); err != nil {
						return err
					}
				}
				return nil
			})
		})
		require.NoError(t, err)
		if i >= 3 {
			rates = append(rates, 2*10*n/d.Seconds()/1e9)
		}
	}
	sort.Float64s(rates)
	return rates[len(rates)/2]
}

// TestBF16TimesVariant: -bf16.times.variants' entries as knobs.
func TestBF16TimesVariant(t *testing.T) {
	for _, c := range []struct {
		v     string
		knobs cudatune.Knobs
		lt    bool
	}{
		{"d2", cudatune.Knobs{BF16MMADepth: 2}, false},
		{"d8f/b1", cudatune.Knobs{BF16MMADepth: 8, BF16MMAReduce: 2, BF16MMABlocksPerSM: 1}, false},
		{"d4wf", cudatune.Knobs{BF16MMADepth: 4, BF16MMAReduce: 2, BF16MMAWarpRows: 32}, false},
		{"d4w/b3", cudatune.Knobs{BF16MMADepth: 4, BF16MMAWarpRows: 32, BF16MMABlocksPerSM: 3}, false},
		{"d8f/b1/s16", cudatune.Knobs{BF16MMADepth: 8, BF16MMAReduce: 2, BF16MMABlocksPerSM: 1, BF16MMAMaxSplits: 16}, false},
		{"d2/s16", cudatune.Knobs{BF16MMADepth: 2, BF16MMAMaxSplits: 16}, false},
		{"cublaslt", cudatune.Knobs{}, true},
		{"wg", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32}, false},
		{"wg/f2", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAFinish: 2}, false},
		{"wg/f1/s4", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAFinish: 1, BF16WGMMAMaxSplits: 4}, false},
		{"wg/s3", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAMaxSplits: 3}, false},
		{"wg/t64", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAMaxTile: 64}, false},
		{"wg/f2/r4", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAFinish: 2, BF16WGMMAMaxStages: 4}, false},
		{"wg/p", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAL2Prefetch: 1}, false},
		{"wg/f3/p", cudatune.Knobs{BF16WGMMAMaxRows: math.MaxInt32, BF16WGMMAFinish: 3, BF16WGMMAL2Prefetch: 1}, false},
	} {
		k, lt, err := bf16TimesVariant(c.v)
		require.NoError(t, err, c.v)
		require.Equal(t, c.knobs, k, c.v)
		require.Equal(t, c.lt, lt, c.v)
	}
	for _, bad := range []string{"x4", "d", "d4/bx", "4", "d4/sx", "wg/f4", "wg/x", "wgf1", "wg/", "wg/f1/f2", "wg/s0", "wg/s", "wg/t4", "wg/r1", "wg/p/p", "wgp"} {
		_, _, err := bf16TimesVariant(bad)
		require.Error(t, err, bad)
	}
}
