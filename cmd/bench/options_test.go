package main

import (
	"github.com/dsv4mla/prologue/internal/cudatune"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla/cuda"
)

func TestParseVariant(t *testing.T) {
	cases := []struct {
		text string
		want variant
		err  string // substring of the error; "" = no error
	}{
		{"", variant{}, ""},
		{"  ", variant{}, ""},
		{"warps=4 kvd=8", variant{Name: "warps=4 kvd=8", Warps: 4, KVDepth: 8}, ""},
		{"qd=6 qchunk=4 bpsm=8 maxblocks=3", variant{Name: "qd=6 qchunk=4 bpsm=8 maxblocks=3", QDepth: 6, QChunk: 4, BlocksPerSM: 8, MaxBlocks: 3}, ""},
		{"nopdl separate", variant{Name: "nopdl separate", NoPDL: true, SeparateLaunches: true}, ""},
		{"direct=8192 dwarps=2 dhalf=64 qrows=4 dminb=10", variant{Name: "direct=8192 dwarps=2 dhalf=64 qrows=4 dminb=10", DirectMaxRows: 8192, DirectWarps: 2,
			DirectHalfBlockRows: 64, DirectQRows: 4, DirectMinBlocks: 10}, ""},
		{"direct=100 directbf16=200", variant{Name: "direct=100 directbf16=200", DirectMaxRows: 100, DirectMaxRowsBF16: 200}, ""},
		{"nodirect", variant{Name: "nodirect", NoDirect: true}, ""},
		{"ikeys=2 iquery=2", variant{Name: "ikeys=2 iquery=2", IndexerKeys: 2, IndexerQuery: 2}, ""},
		{"istream=2", variant{Name: "istream=2", IndexerStream: 2}, ""},
		{"bfwg=128 bfwgfin=2 bfwgs=4 bfwgt=64 bfwgr=4", variant{Name: "bfwg=128 bfwgfin=2 bfwgs=4 bfwgt=64 bfwgr=4", BF16WGMMAMaxRows: 128,
			BF16WGMMAFinish: 2, BF16WGMMAMaxSplits: 4, BF16WGMMAMaxTile: 64, BF16WGMMAMaxStages: 4}, ""},
		{"nodirect=1", variant{}, "takes no value"},
		{"direct=-1", variant{}, "outside [0, 16777216]"},
		{"warps=0", variant{Name: "warps=0"}, ""},
		{"warps=x", variant{}, `warps="x" is not a whole number`},
		{"warps=4.5", variant{}, "not a whole number"},
		{"warps=", variant{}, "needs a number"},
		{"warps", variant{}, "needs a number"},
		{"warps=-1", variant{}, "outside [0, 16777216]"},
		{"kvd=20000000", variant{}, "outside"},
		{"bogus=1", variant{}, `unknown option "bogus"`},
		{"Warps=4", variant{}, `unknown option "Warps"`},
		{"nopdl=1", variant{}, "takes no value"},
		{"warps=4 warps=8", variant{}, "given twice"},
		{"nopdl nopdl", variant{}, "given twice"},
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) {
			got, err := parseVariant(c.text)
			if c.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), c.err)
				assert.Contains(t, err.Error(), c.text, "the error names the variant")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
}

func TestParseVariants(t *testing.T) {
	vs, err := parseVariants("warps=4;qd=6 nopdl")
	require.NoError(t, err)
	require.Len(t, vs, 2)
	assert.Equal(t, 4, vs[0].Warps)
	assert.Equal(t, 6, vs[1].QDepth)
	assert.True(t, vs[1].NoPDL)

	vs, err = parseVariants("")
	require.NoError(t, err)
	assert.Empty(t, vs)

	_, err = parseVariants("warps=4;;qd=6")
	require.ErrorContains(t, err, "entry 2 is empty")
	_, err = parseVariants("warps=4;kvd=z")
	require.ErrorContains(t, err, "not a whole number")
}

func TestVariantOptions(t *testing.T) {
	v := variant{Warps: 3, KVDepth: 5, QDepth: 7, QChunk: 4, BlocksPerSM: 2, MaxBlocks: 11, DirectMaxRows: 99, DirectMaxRowsBF16: 98, DirectWarps: 2,
		DirectHalfBlockRows: 17, DirectQRows: 3, DirectMinBlocks: 6, IndexerKeys: 2, IndexerQuery: 1, IndexerStream: 2, IndexerQueryWideMinRows: 64, IndexerQueryLaneMinRows: 1024, NoPDL: true, SeparateLaunches: true}
	opts, knobs := v.options(true)
	assert.Equal(t, cuda.Options{NoPDL: true}, opts)
	assert.Equal(t, cudatune.Knobs{Warps: 3, KVDepth: 5, QDepth: 7, QChunk: 4, BlocksPerSM: 2, MaxBlocks: 11,
		DirectMaxRows: 99, DirectMaxRowsBF16: 98, DirectWarps: 2, DirectHalfBlockRows: 17, DirectQRows: 3, DirectMinBlocks: 6,
		IndexerKeys: cudatune.IndexerKeysFused, IndexerQuery: cudatune.IndexerQueryLate, IndexerStream: cudatune.IndexerStreamAux,
		IndexerQueryWideMinRows: 64, IndexerQueryLaneMinRows: 1024,
		SeparateLaunches: true, Verbose: true}, knobs)
	_, knobs = variant{DirectMaxRows: 99, DirectMaxRowsBF16: 98, NoDirect: true}.options(false)
	assert.Equal(t, -1, knobs.DirectMaxRows, "nodirect turns the direct path off")
	assert.Equal(t, -1, knobs.DirectMaxRowsBF16, "nodirect turns the direct path off for bf16 Q too")
	assert.False(t, knobs.Defaults().Direct(1, false))
	assert.False(t, knobs.Defaults().Direct(1, true))
	opts, knobs = variant{}.options(false)
	assert.Equal(t, cuda.Options{}, opts, "the empty variant keeps every default")
	assert.Equal(t, cudatune.Knobs{}, knobs, "the empty variant keeps every default")
}
