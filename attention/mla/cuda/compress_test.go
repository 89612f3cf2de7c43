package cuda_test

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/internal/cudatune"
	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

// compressRopePositions covers every entry the tests emit (i*r < 1024).
const compressRopePositions = 1024

var compressRope = sync.OnceValues(func() (*dsv4.RopeTable, error) {
	return dsv4.NewRopeTable(dsv4.Flash(), dsv4.RopeYaRN, dsv4.RopeExact, compressRopePositions)
})

// compressLogits names how a case draws the logits G.
type compressLogits int

const (
	logitsNormal   compressLogits = iota // N(0.5, 3): weights that differ
	logitsWide                           // uniform in [-120, 0]: exp32 underflows and subnormal weights
	logitsEqual                          // one value per channel for every token: equal weights
	logitsSpecials                       // -Inf, -1e30, ±0 sprinkled; NaN, +Inf and an all -Inf channel in a few windows
)

// compressTokens returns n tokens' projections, width values each.
func compressTokens(r *rand.Rand, n, width, ratio int, kind compressLogits) (K, G [][]float32) {
	K, G = make([][]float32, n), make([][]float32, n)
	same := make([]float32, width)
	for c := range same {
		same[c] = float32(r.NormFloat64() * 4)
	}
	for t := range n {
		K[t], G[t] = make([]float32, width), make([]float32, width)
		scale := math.Ldexp(1, r.IntN(6)-2)
		for c := range width {
			K[t][c] = float32(r.NormFloat64() * scale)
			switch kind {
			case logitsNormal, logitsSpecials:
				G[t][c] = float32(r.NormFloat64()*3 + 0.5)
			case logitsWide:
				G[t][c] = float32(-120 * r.Float64())
			case logitsEqual:
				G[t][c] = same[c]
			}
			if kind == logitsSpecials {
				switch u := r.Float64(); {
				case u < 0.05:
					G[t][c] = float32(math.Inf(-1))
				case u < 0.08:
					G[t][c] = -1e30
				case u < 0.10:
					G[t][c] = float32(math.Copysign(0, r.Float64()-0.5))
				}
			}
		}
	}
	if kind == logitsSpecials {
		// Whole entries of NaN: channel 3 all -Inf over window 1's candidates,
		// a NaN logit in window 2, +Inf in window 3 (where the prompt has them).
		for t := range n {
			w := t / ratio
			if w == 1 || (ratio == 4 && w == 0) {
				for c := 3; c < width; c += compressor.Dim {
					G[t][c] = float32(math.Inf(-1))
				}
			}
		}
		if t := 2*ratio + 1; t < n {
			G[t][width-5] = float32(math.NaN())
		}
		if t := 3*ratio + 2; t < n {
			G[t][width-9] = float32(math.Inf(1))
		}
	}
	return K, G
}

// upload copies float32 values (or bytes) into a new device buffer.
func uploadFloats(t *testing.T, b *cuda.Backend, vals []float32) mla.Buffer {
	t.Helper()
	raw := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	return uploadBytes(t, b, raw)
}

func uploadBytes(t *testing.T, b *cuda.Backend, raw []byte) mla.Buffer {
	t.Helper()
	buf, err := b.Alloc(len(raw))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Free(buf)) })
	require.NoError(t, b.Write(buf, 0, raw))
	return buf
}

type compressCase struct {
	name     string
	ratio    int
	lengths  []int
	logits   compressLogits
	split    string // where the prompt's rows live: "new", "state" or "half" (positions below L/2 in the state space)
	pageSize int
}

var compressCases = []compressCase{
	{"normal", 4, []int{1, 3, 4, 5, 7, 8, 9, 127, 128, 129, 257}, logitsNormal, "half", 64},
	{"wide", 4, []int{8, 64, 131}, logitsWide, "new", 5},
	{"equal", 4, []int{4, 12, 64}, logitsEqual, "state", 64},
	{"specials", 4, []int{5, 18, 33, 100}, logitsSpecials, "half", 7},
	{"normal", 128, []int{1, 127, 128, 129, 255, 256, 257}, logitsNormal, "half", 64},
	{"wide", 128, []int{256, 384}, logitsWide, "state", 3},
	{"equal", 128, []int{128, 257}, logitsEqual, "new", 64},
	{"specials", 128, []int{384, 520}, logitsSpecials, "half", 2},
}

// TestCUDACompressEntries runs compress_entries on random projections and
// compares the whole pool, byte for byte, with package compressor's
// entries stored into the same poisoned pool: every entry (entry 0 of ratio
// 4 without a previous window, RoPE at i*r) and nothing outside them.
// Candidates come from both row spaces (the state's rows shuffled, unread
// rows poisoned with NaN), the jobs in random order to random pool slots.
func TestCUDACompressEntries(t *testing.T) {
	b := backend(t)
	runCompressCases(t, compressCases, gpuCompress(t, b))
}

// TestCUDACompressEntriesLooping: with two blocks, each block loops over
// many jobs (its shared row is reused).
func TestCUDACompressEntriesLooping(t *testing.T) {
	backend(t)
	b, err := cuda.NewTuned(cuda.Options{}, cudatune.Knobs{MaxBlocks: 2})
	require.NoError(t, err)
	// A cleanup, not a defer: the cases' buffers are freed by cleanups,
	// which run after the test function returns, before this one.
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	runCompressCases(t, []compressCase{compressCases[0], compressCases[3], compressCases[7]}, gpuCompress(t, b))
}

// compressInputs is one case's host data: the two row spaces, the layer's
// parameters, the jobs and the pool's shape.
type compressInputs struct {
	ratio, width       int
	newK, newG         []float32
	newRows            int
	stateK, stateG     []float32
	stateRows          int
	norm               []float32
	eps                float32
	jobs               []cuda.CompressJob
	pageSize, numPages int
	poison             byte
}

// compressRunner computes a case's pool: on the device, or the host
// emulation of the kernel's addressing.
type compressRunner func(t *testing.T, in *compressInputs) []byte

func runCompressCases(t *testing.T, cases []compressCase, run compressRunner) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	table, err := compressRope()
	require.NoError(t, err)
	for ci, tc := range cases {
		for _, n := range tc.lengths {
			name := fmt.Sprintf("r%d/%s/len%d/%s/page%d", tc.ratio, tc.name, n, tc.split, tc.pageSize)
			t.Run(name, func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, uint64(ci)<<32|uint64(n)))
				runCompressCase(t, r, table, tc, n, run)
			})
		}
	}
}

// gpuCompress runs compress_entries on b, with the RoPE table uploaded
// once for t's cases.
func gpuCompress(t *testing.T, b *cuda.Backend) compressRunner {
	table, err := compressRope()
	require.NoError(t, err)
	ropeBuf := uploadBytes(t, b, table.Bytes())
	return func(t *testing.T, in *compressInputs) []byte {
		size := in.numPages * kvcache.FormatFP8UE8M0.PageBytes(in.pageSize)
		pool, err := b.Alloc(size)
		require.NoError(t, err)
		defer func() { require.NoError(t, b.Free(pool)) }()
		require.NoError(t, b.Fill(pool, 0, size, in.poison))
		l := &cuda.CompressLayer{
			Ratio: in.ratio,
			NewK:  uploadFloats(t, b, in.newK), NewG: uploadFloats(t, b, in.newG), NewRows: in.newRows,
			StateK: uploadFloats(t, b, in.stateK), StateG: uploadFloats(t, b, in.stateG), StateRows: in.stateRows,
			NormWeight: uploadFloats(t, b, in.norm), Eps: in.eps,
			Rope: ropeBuf, RopePositions: table.Positions,
			Pool: pool, PageSize: in.pageSize, NumPages: in.numPages,
		}
		require.NoError(t, b.CompressEntries(context.Background(), l, in.jobs))
		got := make([]byte, size)
		require.NoError(t, b.Read(got, pool, 0))
		return got
	}
}

// hostCompress emulates compress_entries on the host from the packed job
// list the kernel reads (int32 {index, cand, page, off} per job, then the
// codes): the row codes, the halves and the destinations, with package
// compressor's math. It checks the test's plumbing and the packing without
// a GPU.
func hostCompress(t *testing.T, in *compressInputs) []byte {
	pool := bytes.Repeat([]byte{in.poison}, in.numPages*kvcache.FormatFP8UE8M0.PageBytes(in.pageSize))
	hostCompressInto(t, in, pool)
	return pool
}

// hostCompressInto is hostCompress storing into an existing pool.
func hostCompressInto(t *testing.T, in *compressInputs, pool []byte) {
	table, err := compressRope()
	require.NoError(t, err)
	layer, err := compressor.NewLayer(compressor.Params{Ratio: in.ratio, NormWeight: in.norm, Eps: in.eps, Rope: table})
	require.NoError(t, err)
	packed := cuda.PackCompressJobs(in.jobs)
	word := func(i int) int32 { return int32(binary.LittleEndian.Uint32(packed[4*i:])) }
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(in.pageSize)
	codes := 4 * len(in.jobs)
	for j := range in.jobs {
		index, cand, page, off := int(word(4*j)), int(word(4*j+1)), int(word(4*j+2)), int(word(4*j+3))
		n := cuda.CompressCandidates(in.ratio, index)
		nlo := n
		if in.ratio == 4 {
			nlo = n - 4
		}
		var pooled [compressor.Dim]float32
		logits, values := make([]float32, n), make([]float32, n)
		for c := range compressor.Dim {
			for k := range n {
				code := word(codes + cand + k)
				kr, gr := in.newK, in.newG
				row := int(code)
				if code < 0 {
					kr, gr, row = in.stateK, in.stateG, int(^code)
				}
				col := c
				if k >= nlo {
					col += compressor.Dim
				}
				logits[k], values[k] = gr[row*in.width+col], kr[row*in.width+col]
			}
			pooled[c] = compressor.PoolChannel(logits, values)
		}
		e, err := layer.FinishEntry(index, &pooled)
		require.NoError(t, err)
		e.Store(pool[page*pageBytes:(page+1)*pageBytes], in.pageSize, off)
	}
}

// TestCompressJobsHost runs the GPU test's cases through the host
// emulation of the kernel's addressing (no GPU needed).
func TestCompressJobsHost(t *testing.T) {
	cases := []compressCase{compressCases[0], compressCases[3], compressCases[4], compressCases[7]}
	if testing.Short() {
		cases = cases[:2]
	}
	runCompressCases(t, cases, hostCompress)
}

func runCompressCase(t *testing.T, r *rand.Rand, table *dsv4.RopeTable, tc compressCase, n int, run compressRunner) {
	ratio := tc.ratio
	width := compressor.Overlap(ratio) * compressor.Dim
	norm := make([]float32, compressor.Dim)
	for i := range norm {
		norm[i] = numerics.RoundBF16(float32(1 + 0.25*r.NormFloat64()))
	}
	const eps = 1e-6
	layer, err := compressor.NewLayer(compressor.Params{Ratio: ratio, NormWeight: norm, Eps: eps, Rope: table})
	require.NoError(t, err)
	K, G := compressTokens(r, n, width, ratio, tc.logits)

	// The reference: package compressor over the whole prompt.
	entries, err := layer.NewState().Append(0, K, G)
	require.NoError(t, err)
	require.Len(t, entries, n/ratio)

	// Row placement: positions below split in the state space at shuffled
	// rows (one spare row), the rest in the new space from row 1; row 0 of
	// the new space and the spare state row are NaN, never read.
	split := map[string]int{"new": 0, "state": n, "half": n / 2}[tc.split]
	nan := float32(math.NaN())
	in := &compressInputs{ratio: ratio, width: width, norm: norm, eps: eps, pageSize: tc.pageSize, poison: 0xa5}
	in.stateRows = split + 1
	perm := r.Perm(in.stateRows)
	in.stateK = make([]float32, in.stateRows*width)
	in.stateG = make([]float32, in.stateRows*width)
	for i := range in.stateK {
		in.stateK[i], in.stateG[i] = nan, nan
	}
	in.newRows = n - split + 1
	in.newK = make([]float32, in.newRows*width)
	in.newG = make([]float32, in.newRows*width)
	for i := range width {
		in.newK[i], in.newG[i] = nan, nan
	}
	code := make([]int32, n)
	for pos := range n {
		var dk, dg []float32
		if pos < split {
			row := perm[pos]
			code[pos] = cuda.StateRow(row)
			dk, dg = in.stateK[row*width:(row+1)*width], in.stateG[row*width:(row+1)*width]
		} else {
			row := pos - split + 1
			code[pos] = int32(row)
			dk, dg = in.newK[row*width:(row+1)*width], in.newG[row*width:(row+1)*width]
		}
		copy(dk, K[pos])
		copy(dg, G[pos])
	}

	// Jobs: every entry, in random order, to distinct random pool slots.
	in.numPages = len(entries)/tc.pageSize + 2
	slots := r.Perm(in.numPages * tc.pageSize)
	jobs := make([]cuda.CompressJob, len(entries))
	for i := range entries {
		var cands []int32
		first := i * ratio
		if ratio == 4 && i > 0 {
			first -= ratio
		}
		for pos := first; pos < (i+1)*ratio; pos++ {
			cands = append(cands, code[pos])
		}
		require.Len(t, cands, cuda.CompressCandidates(ratio, i))
		jobs[i] = cuda.CompressJob{Index: i, Candidates: cands, Page: slots[i] / tc.pageSize, Offset: slots[i] % tc.pageSize}
	}
	in.jobs = make([]cuda.CompressJob, len(jobs))
	for k, j := range r.Perm(len(jobs)) {
		in.jobs[k] = jobs[j]
	}

	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(tc.pageSize)
	want := bytes.Repeat([]byte{in.poison}, in.numPages*pageBytes)
	for i := range entries {
		require.Equal(t, i, entries[i].Index)
		p := jobs[i].Page
		entries[i].Store(want[p*pageBytes:(p+1)*pageBytes], tc.pageSize, jobs[i].Offset)
	}
	got := run(t, in)
	if bytes.Equal(got, want) {
		return
	}
	// Name the entries that differ, then any byte outside them.
	f := kvcache.FormatFP8UE8M0
	inEntry := make([]bool, len(want))
	bad := 0
	for i, jb := range jobs {
		base := jb.Page * pageBytes
		vo, so := base+f.ValueOffset(tc.pageSize, jb.Offset), base+f.ScaleOffset(tc.pageSize, jb.Offset)
		for k := vo; k < vo+kvcache.UE8M0ValueBytes; k++ {
			inEntry[k] = true
		}
		for k := so; k < so+kvcache.UE8M0ScaleBytes; k++ {
			inEntry[k] = true
		}
		gv, wv := got[vo:vo+kvcache.UE8M0ValueBytes], want[vo:vo+kvcache.UE8M0ValueBytes]
		gs, ws := got[so:so+kvcache.UE8M0ScaleBytes], want[so:so+kvcache.UE8M0ScaleBytes]
		if !bytes.Equal(gv, wv) || !bytes.Equal(gs, ws) {
			if bad++; bad <= 4 {
				first := -1
				for k := range gv {
					if gv[k] != wv[k] {
						first = k
						break
					}
				}
				t.Errorf("entry %d (page %d offset %d): values differ first at byte %d; scales got %x, want %x", i, jb.Page, jb.Offset, first, gs, ws)
			}
		}
	}
	for k := range got {
		if !inEntry[k] && got[k] != want[k] {
			t.Errorf("byte %d outside every entry changed: %#02x, poison %#02x", k, got[k], want[k])
			break
		}
	}
	t.Fatalf("%d of %d entries differ", bad, len(jobs))
}

//go:embed testdata/exp32.cu
var exp32TestSource string

// exp32Term is testdata/exp32.cu's per-input hash term.
func exp32Term(in, out uint32) uint64 {
	z := uint64(in)<<32 | uint64(out)
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// TestCUDAExp32Exhaustive compares the device's exp32 (kernels/cuda/exp32.cuh)
// with numerics.Exp32 for every float32 bit pattern: a superset of the
// softmax's inputs (every x <= 0 with -0, -Inf and the subnormals, +0, and
// NaNs). The device hashes each chunk of 2^20 results; the host computes the
// same hashes in parallel; a chunk that differs is read back whole to name
// its first differences.
func TestCUDAExp32Exhaustive(t *testing.T) {
	b := backend(t)
	mod, err := b.CompileWithCompressKernels("exp32.cu", exp32TestSource)
	require.NoError(t, err)
	defer func() { require.NoError(t, mod.Unload()) }()
	hashFn, err := mod.Function("exp32_hash")
	require.NoError(t, err)
	valuesFn, err := mod.Function("exp32_values")
	require.NoError(t, err)

	const chunkLog2 = 20
	const chunk = 1 << chunkLog2
	const nchunks = 1 << (32 - chunkLog2)
	hashes, err := b.Alloc(8 * nchunks)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Free(hashes)) }()
	require.NoError(t, b.Fill(hashes, 0, 8*nchunks, 0))
	grid := driver.Dim3{uint32(b.Props().SMCount * 8), 1, 1}
	require.NoError(t, b.Context().Launch(hashFn, grid, driver.Dim3{256, 1, 1}, 0, b.Stream(),
		hashes.(*cuda.Buffer).Ptr(), uint32(0), uint32(chunk), uint32(nchunks)))
	raw := make([]byte, 8*nchunks)
	require.NoError(t, b.Read(raw, hashes, 0))

	var next atomic.Int64
	bad := make([]bool, nchunks)
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ch := next.Add(1) - 1
				if ch >= nchunks {
					return
				}
				var h uint64
				first := uint32(ch) << chunkLog2
				for i := range uint32(chunk) {
					in := first + i
					h += exp32Term(in, math.Float32bits(numerics.Exp32(math.Float32frombits(in))))
				}
				bad[ch] = h != binary.LittleEndian.Uint64(raw[8*ch:])
			}
		}()
	}
	wg.Wait()

	badChunks := 0
	out, err := b.Alloc(4 * chunk)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.Free(out)) }()
	host := make([]byte, 4*chunk)
	for ch := range nchunks {
		if !bad[ch] {
			continue
		}
		if badChunks++; badChunks > 3 {
			continue
		}
		first := uint32(ch) << chunkLog2
		require.NoError(t, b.Context().Launch(valuesFn, grid, driver.Dim3{256, 1, 1}, 0, b.Stream(),
			out.(*cuda.Buffer).Ptr(), first, uint32(chunk)))
		require.NoError(t, b.Read(host, out, 0))
		shown := 0
		for i := range uint32(chunk) {
			in := first + i
			gotBits := binary.LittleEndian.Uint32(host[4*i:])
			wantBits := math.Float32bits(numerics.Exp32(math.Float32frombits(in)))
			if gotBits != wantBits && shown < 3 {
				shown++
				t.Errorf("exp32(%#08x = %g): device %#08x (%g), Go %#08x (%g)", in, math.Float32frombits(in),
					gotBits, math.Float32frombits(gotBits), wantBits, math.Float32frombits(wantBits))
			}
		}
	}
	t.Logf("2^32 inputs in %d chunks, %d chunks differ", nchunks, badChunks)
	require.Zero(t, badChunks)
}

// TestExp32TestKernelsCompile compiles testdata/exp32.cu after the
// compressor's program with NVRTC where it is installed (no GPU needed).
func TestExp32TestKernelsCompile(t *testing.T) {
	cuda.SkipCompileUnderRace(t)
	if err := driver.NVRTCAvailable(); err != nil {
		t.Skipf("no NVRTC: %v", err)
	}
	src := kernels.CompressSource() + "\n#line 1 \"exp32.cu\"\n" + exp32TestSource
	c, err := driver.CompileDetailed(src, "exp32.cu", driver.CompileOptions{Arch: "sm_90", NoFMAD: true, NoCache: true, Headers: kernels.Headers()})
	require.NoError(t, err)
	for _, k := range []string{"exp32_hash", "exp32_values", "compress_entries"} {
		require.True(t, bytes.Contains(c.Cubin, []byte(k)), "the cubin has no %s", k)
	}
}
