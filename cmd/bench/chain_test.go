package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/kvcache"
)

func TestChainDims(t *testing.T) {
	cases := []struct {
		model                   string
		hidden, fusedN, qN, qLo int
		weights                 int64
	}{
		// [wq_a; wkv] 1536 x 4096 and wq_b 32768 x 1024, e4m3 with 128x128
		// float32 scales, and the 1024 float32 q_norm weight.
		{"flash", 4096, 1536, 32768, 1024, 1536*4096 + 4*12*32 + 32768*1024 + 4*256*8 + 4*1024},
		// [wq_a; wkv] 2048 x 7168 and wq_b 65536 x 1536.
		{"pro", 7168, 2048, 65536, 1536, 2048*7168 + 4*16*56 + 65536*1536 + 4*512*12 + 4*1536},
	}
	for _, c := range cases {
		t.Run(c.model, func(t *testing.T) {
			md, err := modelNamed(c.model)
			require.NoError(t, err)
			cd := chainDimsOf(md)
			assert.Equal(t, c.hidden, cd.hidden)
			assert.Equal(t, c.fusedN, cd.fusedN)
			assert.Equal(t, c.qN, cd.qN)
			assert.Equal(t, c.qLo, cd.qLora)
			assert.Equal(t, c.weights, cd.weightBytes())
			// 3 tokens: the hidden rows read, one FP8 byte per Q value and
			// the cache row written.
			f := kvcache.FormatFP8UE8M0
			assert.Equal(t, int64(3*(2*c.hidden+c.qN+f.BytesPerToken())), cd.ioBytes(3, f))
		})
	}
	// Odd sizes: a matrix whose sides are not multiples of 128 still counts
	// a scale for its partial blocks.
	assert.Equal(t, int64(130*129+4*2*2), fp8WeightBytes(130, 129))
}

func TestChainShapes(t *testing.T) {
	c, err := parseFlags([]string{"--chain-batches", "2,7", "--mtp", "0,3", "--chain-ctx-tokens", "3000"}, nil)
	require.NoError(t, err)
	shapes := c.chainShapes()
	require.Len(t, shapes, 5)
	want := []struct {
		phase         string
		batch, tokens int
	}{{"generation", 2, 2}, {"generation", 7, 7}, {"generation", 2, 8}, {"generation", 7, 28}, {"context", 2, 3000}}
	for i, w := range want {
		assert.Equal(t, w.phase, shapes[i].Phase, i)
		assert.Equal(t, w.batch, shapes[i].Batch, i)
		assert.Equal(t, w.tokens, shapes[i].Tokens, i)
	}
}

func TestChainKVNames(t *testing.T) {
	names := map[string]bool{}
	for _, k := range []chainKV{kvForked, kvNone, kvSerial, kvAlone} {
		assert.NotContains(t, k.String(), "chainKV(", "every way has a name")
		names[k.String()] = true
	}
	assert.Len(t, names, 4, "the names differ")
	assert.Equal(t, "chainKV(9)", chainKV(9).String())
}

func TestChainSeries(t *testing.T) {
	rep, err := readReport("testdata/bench-chain.json")
	require.NoError(t, err)
	data, err := os.ReadFile("testdata/chain-peer.json")
	require.NoError(t, err)
	peers := &peerReport{}
	require.NoError(t, json.Unmarshal(data, peers))

	by := map[string]series{}
	for _, s := range chainSeries(rep, peers, "flash") {
		by[s.Label] = s
	}
	assert.Equal(t, []point{{32, 17}, {128, 20}}, by["ours, KV forked, generation MTP 3"].Points, "sorted by tokens")
	assert.Equal(t, []point{{1, 15}}, by["ours, KV forked, generation MTP 0"].Points)
	assert.Equal(t, []point{{4096, 300}}, by["ours, KV forked, context"].Points)
	assert.Equal(t, []point{{32, 16.9}, {128, 19.5}}, by["ours, without the KV prologue, generation MTP 3"].Points)
	// The peer's failed entry (null) is left out, not drawn as zero.
	assert.Equal(t, []point{{128, 70}}, by["PyTorch chain (_scaled_mm + torch.compile, one graph), generation MTP 3"].Points)
	fl := by["weight-streaming floor (weights at the copy rate)"]
	assert.Equal(t, ceiling, fl.Kind)
	assert.Equal(t, []point{{1, 9.96}, {32, 9.96}, {128, 9.96}, {4096, 9.96}}, fl.Points, "one point per token count")
	io := by["floor: weights + hidden in + Q and cache out, at the copy rate"]
	require.Len(t, io.Points, 4)
	assert.Equal(t, 52.5, io.Points[3].Us)

	for _, s := range chainSeries(rep, nil, "pro") {
		assert.NotContains(t, s.Label, "PyTorch")
	}
	assert.Empty(t, chainSeries(rep, peers, "other"))
}

func TestReportWritesChainPlots(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, reportMain([]string{"--go", "testdata/bench-chain.json", "--chain-peer", "testdata/chain-peer.json",
		"--out-dir", dir, "--prefix", "chain"}, &out, &bytes.Buffer{}))
	for _, m := range []string{"flash", "pro"} {
		for _, ext := range []string{".png", ".svg"} {
			p := filepath.Join(dir, "chain-chain-"+m+ext)
			assert.Contains(t, out.String(), p)
			st, err := os.Stat(p)
			require.NoError(t, err)
			assert.Positive(t, st.Size())
		}
		// No layer graphs or single launches in a chain-only report.
		_, err := os.Stat(filepath.Join(dir, "chain-layer-"+m+".png"))
		assert.True(t, os.IsNotExist(err))
	}
	svg, err := os.ReadFile(filepath.Join(dir, "chain-chain-flash.svg"))
	require.NoError(t, err)
	assert.Contains(t, string(svg), "PyTorch chain")

	bad := filepath.Join(dir, "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"chain": [`), 0o644))
	err = reportMain([]string{"--go", "testdata/bench-chain.json", "--chain-peer", bad, "--out-dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "bad.json")
	err = reportMain([]string{"--go", "testdata/bench-chain.json", "--chain-peer", filepath.Join(dir, "missing.json"), "--out-dir", dir}, &bytes.Buffer{}, &bytes.Buffer{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "missing.json")
}
