package cuda_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
)

// TestNewTunedRefusesShapes: knobs the kernels cannot be compiled or
// launched with are refused before the device is opened (so this runs
// without a GPU), with the knob named.
func TestNewTunedRefusesShapes(t *testing.T) {
	cases := []struct {
		name  string
		knobs cudatune.Knobs
		want  string
	}{
		{"warps", cudatune.Knobs{Warps: 33}, "Knobs.Warps = 33"},
		{"KV ring over 48 KiB", cudatune.Knobs{Warps: 8, KVDepth: 5}, "KV 51200 bytes"},
		// 8 warps x (6 slots + the bf16 stage) x 1 KiB.
		{"Q ring and stage over 48 KiB", cudatune.Knobs{Warps: 8, QDepth: 6}, "Q 57344 bytes"},
		{"Q chunk", cudatune.Knobs{QChunk: 1025}, "Knobs.QChunk = 1025"},
		{"direct warps", cudatune.Knobs{DirectWarps: 33}, "Knobs.DirectWarps = 33"},
		{"direct Q rows", cudatune.Knobs{DirectQRows: 9}, "Knobs.DirectQRows = 9"},
		{"direct occupancy", cudatune.Knobs{DirectWarps: 8, DirectMinBlocks: 9}, "Knobs.DirectMinBlocks = 9"},
		{"bf16 MMA depth", cudatune.Knobs{BF16MMADepth: 3}, "Knobs.BF16MMADepth = 3"},
		{"indexer query kernel", cudatune.Knobs{IndexerQuery: cudatune.IndexerQueryTok + 1}, "Knobs.IndexerQuery = 8"},
		{"bf16 MMA reduce", cudatune.Knobs{BF16MMAReduce: 3}, "Knobs.BF16MMAReduce = 3"},
		{"indexer stream", cudatune.Knobs{IndexerStream: 3}, "Knobs.IndexerStream = 3"},
		{"cuBLASLt split K", cudatune.Knobs{CuBLASLtSplitK: 4}, "Knobs.CuBLASLtSplitK = 4"},
		{"bf16 MMA wide warps at depth 2", cudatune.Knobs{BF16MMADepth: 2, BF16MMAReduce: 2, BF16MMAWarpRows: 32}, "BF16MMADepth = 2, BF16MMAReduce = 2, BF16MMAWarpRows = 32: the tensor-core bf16 kernels are (2, 1, 16), (2, 2, 16), (4, 1, 16)"},
		{"bf16 MMA wide warps at depth 8", cudatune.Knobs{BF16MMADepth: 8, BF16MMAWarpRows: 32}, "BF16MMAWarpRows = 32: the"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := cuda.NewTuned(cuda.Options{}, c.knobs)
			require.Nil(t, b)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// TestNewTunedAcceptsIndexerQueries: every named query kernel passes the
// knob checks (without a device NewTuned fails later, opening it).
func TestNewTunedAcceptsIndexerQueries(t *testing.T) {
	for q := cudatune.IndexerQueryLate; q <= cudatune.IndexerQueryTok; q++ {
		b, err := cuda.NewTuned(cuda.Options{}, cudatune.Knobs{IndexerQuery: q, IndexerQueryWideMinRows: -1})
		if err == nil {
			require.NoError(t, b.Close())
			continue
		}
		require.NotContains(t, err.Error(), "Knobs.IndexerQuery", "IndexerQuery %d", q)
	}
}

// TestCUDAKernelSharedBytes: each compiled streaming kernel's static shared
// memory is what abi.StreamingSharedBytes (the host's 48 KiB check) counts
// for its knobs (the fused layer kernel: the larger part), and the direct
// kernels have none (so the next grid's blocks fit beside them).
func TestCUDAKernelSharedBytes(t *testing.T) {
	backend(t)
	for _, k := range []cudatune.Knobs{{}, {Warps: 4, KVDepth: 8, QDepth: 8}, {Warps: 3, KVDepth: 1, QDepth: 5}} {
		b, err := cuda.NewTuned(cuda.Options{}, k)
		require.NoError(t, err)
		d := k.Defaults()
		kv, q := abi.StreamingSharedBytes(d.Warps, d.KVDepth, d.QDepth)
		for _, kern := range abi.Kernels() {
			want := 0
			if kern.Path == abi.Streaming {
				switch kern.Kind {
				case abi.KindKV:
					want = kv
				case abi.KindQ:
					want = q
				default:
					want = max(kv, q)
				}
			}
			got, err := b.KernelSharedBytes(kern.Name)
			require.NoError(t, err)
			require.Equal(t, want, got, "%s with %+v", kern.Name, k)
		}
		require.NoError(t, b.Close())
	}
}
