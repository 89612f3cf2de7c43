package cuda_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// hostBuffer is a pool stand-in for the host emulation: only its size is read.
type hostBuffer int

func (b hostBuffer) Len() int { return int(b) }

// compressArgsRunner runs one mla.CompressArgs (its Pool set by the runner)
// and returns the pool's bytes afterwards.
type compressArgsRunner struct {
	pool func(t *testing.T, size int, poison byte) mla.Buffer
	run  func(t *testing.T, a *mla.CompressArgs) (int, []byte)
}

// gpuArgsRunner runs Backend.Compress on the device pool.
func gpuArgsRunner(b *cuda.Backend) compressArgsRunner {
	return compressArgsRunner{
		pool: func(t *testing.T, size int, poison byte) mla.Buffer {
			buf, err := b.Alloc(size)
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, b.Free(buf)) })
			require.NoError(t, b.Fill(buf, 0, size, poison))
			return buf
		},
		run: func(t *testing.T, a *mla.CompressArgs) (int, []byte) {
			n, err := b.Compress(context.Background(), a)
			require.NoError(t, err)
			got := make([]byte, a.Pool.Len())
			require.NoError(t, b.Read(got, a.Pool, 0))
			return n, got
		},
	}
}

// hostArgsRunner is Compress with the kernel emulated on the host: the
// plan (jobs and gathered state rows), the kernel's addressing, then the
// states' Advance.
func hostArgsRunner() compressArgsRunner {
	var pool []byte
	return compressArgsRunner{
		pool: func(t *testing.T, size int, poison byte) mla.Buffer {
			pool = bytes.Repeat([]byte{poison}, size)
			return hostBuffer(size)
		},
		run: func(t *testing.T, a *mla.CompressArgs) (int, []byte) {
			jobs, stateK, stateG, stateRows, err := cuda.PlanCompress(a)
			require.NoError(t, err)
			w := a.Layer.Width()
			in := &compressInputs{ratio: a.Layer.Ratio(), width: w, stateK: stateK, stateG: stateG, stateRows: stateRows,
				newRows: len(a.K), norm: a.Layer.NormWeight(), eps: a.Layer.Eps(), jobs: jobs, pageSize: a.PageSize, numPages: a.NumPages}
			for t := range a.K {
				in.newK, in.newG = append(in.newK, a.K[t]...), append(in.newG, a.G[t]...)
			}
			hostCompressInto(t, in, pool)
			for _, s := range a.Seqs {
				_, err := s.State.Advance(s.StartPos, a.K[s.Row:s.Row+s.Rows], a.G[s.Row:s.Row+s.Rows])
				require.NoError(t, err)
			}
			return len(jobs), append([]byte(nil), pool...)
		},
	}
}

// runCompressIterations drives several sequences through iterations of
// random chunks (prefill chunks shorter and longer than r, decode steps
// with MTP drafts, some rejected) and checks after each one that the pool
// equals package compressor's (mla.CompressArgs.Run storing into a host
// pool, from cloned states) byte for byte, the entry counts agree and every
// state row is the same.
func runCompressIterations(t *testing.T, ratio int, run compressArgsRunner) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, uint64(ratio)))
	table, err := compressRope()
	require.NoError(t, err)
	norm := make([]float32, compressor.Dim)
	for i := range norm {
		norm[i] = numerics.RoundBF16(float32(1 + 0.25*r.NormFloat64()))
	}
	const maxDrafts = 3
	layer, err := compressor.NewLayer(compressor.Params{Ratio: ratio, NormWeight: norm, Eps: 1e-6, Rope: table, MaxDrafts: maxDrafts})
	require.NoError(t, err)
	const seqs, pageSize = 3, 4
	maxEntries := compressRopePositions / ratio
	pagesPerSeq := (maxEntries + pageSize - 1) / pageSize
	numPages := seqs * pagesPerSeq
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(pageSize)
	const poison = 0x5a
	pool := run.pool(t, numPages*pageBytes, poison)
	want := bytes.Repeat([]byte{poison}, numPages*pageBytes)
	// Sequence b's pages are a shuffled slice of the pool.
	pages := r.Perm(numPages)
	tables := make([][]int32, seqs)
	for b := range tables {
		for j := range pagesPerSeq {
			tables[b] = append(tables[b], int32(pages[b*pagesPerSeq+j]))
		}
	}
	states := make([]*compressor.State, seqs)
	refs := make([]*compressor.State, seqs)
	for b := range states {
		states[b], refs[b] = layer.NewState(), layer.NewState()
	}
	for it := 0; it < 12; it++ {
		a := &mla.CompressArgs{Layer: layer, Pool: pool, PageSize: pageSize, NumPages: numPages}
		ref := &mla.CompressArgs{Layer: layer, Pool: hostBuffer(len(want)), PageSize: pageSize, NumPages: numPages}
		decode := it > 3 && it%2 == 0
		var drafts []int
		for b := range seqs {
			n := 1 + r.IntN(2*ratio+5)
			if decode {
				n = 1 + r.IntN(maxDrafts+1)
			}
			start := states[b].Len()
			n = min(n, compressRopePositions-start)
			if n == 0 {
				continue
			}
			K, G := compressTokens(r, n, layer.Width(), ratio, compressLogits(r.IntN(4)))
			row := len(a.K)
			a.K, a.G = append(a.K, K...), append(a.G, G...)
			a.Seqs = append(a.Seqs, mla.CompressSeq{Row: row, Rows: n, StartPos: start, State: states[b], Table: tables[b]})
			ref.Seqs = append(ref.Seqs, mla.CompressSeq{Row: row, Rows: n, StartPos: start, State: refs[b], Table: tables[b]})
			drafts = append(drafts, n)
		}
		ref.K, ref.G = a.K, a.G
		wantN, err := ref.Run(context.Background(), func(e *compressor.Entry, page int32, off int) error {
			e.Store(want[int(page)*pageBytes:(int(page)+1)*pageBytes], pageSize, off)
			return nil
		})
		require.NoError(t, err)
		gotN, got := run.run(t, a)
		require.Equal(t, wantN, gotN, "iteration %d: entries stored", it)
		if !bytes.Equal(want, got) {
			diff := 0
			for diff < len(got) && got[diff] == want[diff] {
				diff++
			}
			t.Fatalf("iteration %d: the pool differs first at byte %d (page %d)", it, diff, diff/pageBytes)
		}
		// Reject some drafts (a later entry then overwrites the dropped one).
		if decode {
			for k, s := range a.Seqs {
				if back := r.IntN(drafts[k]); back > 0 && back <= maxDrafts {
					d1, err := s.State.Accept(s.State.Len() - back)
					require.NoError(t, err)
					d2, err := ref.Seqs[k].State.Accept(ref.Seqs[k].State.Len() - back)
					require.NoError(t, err)
					require.Equal(t, d2, d1)
				}
			}
		}
		for b := range states {
			require.Equal(t, refs[b].Len(), states[b].Len())
			for p := max(0, states[b].Len()-layer.StateRows()); p < states[b].Len(); p++ {
				k1, g1, ok1 := refs[b].Row(p)
				k2, g2, ok2 := states[b].Row(p)
				require.Equal(t, ok1, ok2, "sequence %d position %d", b, p)
				require.Equal(t, fmt.Sprint(k1, g1), fmt.Sprint(k2, g2), "sequence %d position %d", b, p)
			}
		}
	}
}

// TestCompressArgsHost runs Compress's plan through the host emulation of
// the kernel (no GPU needed).
func TestCompressArgsHost(t *testing.T) {
	for _, ratio := range []int{4, 128} {
		t.Run(fmt.Sprintf("r%d", ratio), func(t *testing.T) { runCompressIterations(t, ratio, hostArgsRunner()) })
	}
}

// TestCUDACompress runs Backend.Compress (mla.CompressorBackend) on the
// device against package compressor.
func TestCUDACompress(t *testing.T) {
	b := backend(t)
	for _, ratio := range []int{4, 128} {
		t.Run(fmt.Sprintf("r%d", ratio), func(t *testing.T) { runCompressIterations(t, ratio, gpuArgsRunner(b)) })
	}
}
