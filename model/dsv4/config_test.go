package dsv4

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEmbeddedConfigs(t *testing.T) {
	tests := []struct {
		name                         string
		cfg                          Config
		hidden, layers, heads, qLora int
		indexTopK                    int
		ratios                       map[int]int // value -> count
		zeroAt                       []int
	}{
		// Flash's counts and zero positions are those of the published
		// config.json: ratio 0 at layers 0 and 1 and the MTP layer (43).
		{"flash", Flash(), 4096, 43, 64, 1024, 512, map[int]int{0: 3, 4: 21, 128: 20}, []int{0, 1, 43}},
		// Pro's are those of public copies of its config.json:
		// [128,128] + [4,128]x29 + [4,0], no SWA-only main layer.
		{"pro", Pro(), 7168, 61, 128, 1536, 1024, map[int]int{0: 1, 4: 30, 128: 31}, []int{61}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.cfg
			require.NoError(t, c.Validate())
			assert.Equal(t, tt.hidden, c.HiddenSize)
			assert.Equal(t, tt.layers, c.NumLayers)
			assert.Equal(t, tt.heads, c.NumHeads)
			assert.Equal(t, tt.qLora, c.QLoraRank)
			assert.Equal(t, 448, c.KVLoraRank)
			assert.Equal(t, 512, c.HeadDim)
			assert.Equal(t, 64, c.QKRopeHeadDim)
			assert.Equal(t, 1, c.NumKVHeads)
			assert.Equal(t, 1, c.NumMTPLayers)
			assert.Len(t, c.CompressRatios, tt.layers+1)
			assert.True(t, c.HasIndexer())
			assert.Equal(t, 64, c.IndexNHeads)
			assert.Equal(t, 128, c.IndexHeadDim)
			assert.Equal(t, tt.indexTopK, c.IndexTopK)
			assert.Equal(t, Quantization{Method: "fp8", Fmt: "e4m3", ScaleFmt: "ue8m0", ActivationScheme: "dynamic", BlockRows: 128, BlockCols: 128}, c.Quant)

			counts := map[int]int{}
			var zeros []int
			for i, r := range c.CompressRatios {
				counts[r]++
				if r == 0 {
					zeros = append(zeros, i)
				}
			}
			assert.Equal(t, tt.ratios, counts)
			assert.Equal(t, tt.zeroAt, zeros)
		})
	}
	// Each call returns a fresh slice: a caller editing one config must not
	// change the next.
	a := Flash()
	a.CompressRatios[0] = 99
	assert.Equal(t, 0, Flash().CompressRatios[0])
}

// TestProCompressRatios pins V4-Pro's list as written out by hand from a
// public copy of its config.json: layers 0 and 1 are ratio 128 (so they read
// the YaRN table), then 29 (4, 128) pairs, layer 60 ratio 4, and the MTP
// layer 0.
func TestProCompressRatios(t *testing.T) {
	want := []int{128, 128,
		4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
		4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128,
		4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, 4, 128, // 29 pairs
		4, 0}
	c := Pro()
	require.Equal(t, want, c.CompressRatios)
	for layer, kind := range map[int]RopeKind{0: RopeYaRN, 1: RopeYaRN, 2: RopeYaRN, 60: RopeYaRN, 61: RopePlain} {
		got, err := c.LayerRope(layer)
		require.NoError(t, err)
		assert.Equal(t, kind, got, "layer %d", layer)
	}
}

// TestMTPRatioAlwaysZero: the MTP layer is uncompressed whatever the last
// main layer is, whether compress_ratios lists it or not, and a listed MTP
// entry other than 0 is refused.
func TestMTPRatioAlwaysZero(t *testing.T) {
	for _, last := range []int{0, 4, 128} {
		listed := Flash()
		listed.CompressRatios[42] = last
		unlisted := listed
		unlisted.CompressRatios = append([]int(nil), listed.CompressRatios[:43]...)
		twoMTP := unlisted
		twoMTP.NumMTPLayers = 2
		for name, c := range map[string]Config{"listed": listed, "unlisted": unlisted, "two MTP layers": twoMTP} {
			require.NoError(t, c.Validate(), "%s, last main layer %d", name, last)
			for layer := c.NumLayers; layer < c.NumAttentionLayers(); layer++ {
				r, err := c.CompressRatio(layer)
				require.NoError(t, err)
				assert.Equal(t, 0, r, "%s, last main layer ratio %d: MTP layer %d", name, last, layer)
				kind, err := c.LayerRope(layer)
				require.NoError(t, err)
				assert.Equal(t, RopePlain, kind)
			}
		}
	}
	bad := Flash()
	bad.CompressRatios[43] = 4
	assert.ErrorContains(t, bad.Validate(), `"compress_ratios[43]" = 4: must be 0: MTP layer 0 keeps only the sliding window`)
}

func TestValidateFields(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"hidden zero", func(c *Config) { c.HiddenSize = 0 }, `"hidden_size" = 0: must be positive`},
		{"layers negative", func(c *Config) { c.NumLayers = -3 }, `"num_hidden_layers" = -3: must be positive`},
		{"q lora zero", func(c *Config) { c.QLoraRank = 0 }, `"q_lora_rank" = 0: must be positive`},
		{"max positions zero", func(c *Config) { c.MaxPositionEmbeddings = 0 }, `"max_position_embeddings" = 0: must be positive`},
		{"head dim 576", func(c *Config) { c.HeadDim = 576 }, `"head_dim" = 576: must be 512`},
		{"kv lora rank 512", func(c *Config) { c.KVLoraRank = 512 }, `"kv_lora_rank" = 512: kv_lora_rank + qk_rope_head_dim (64) = 576, must be 512`},
		{"eps NaN", func(c *Config) { c.RMSNormEps = math.NaN() }, `"rms_norm_eps" = NaN: must be finite and positive`},
		{"eps 0.5", func(c *Config) { c.RMSNormEps = 0.5 }, `"rms_norm_eps" = 0.5: must be in [2^-126, 0.01]`},
		{"eps below float32 normals", func(c *Config) { c.RMSNormEps = 1e-39 }, `"rms_norm_eps" = 1e-39: must be in [2^-126, 0.01]`},
		{"rope theta Inf", func(c *Config) { c.RopeTheta = math.Inf(1) }, `"rope_theta" = +Inf: must be finite and greater than 1`},
		{"compress theta 0.5", func(c *Config) { c.CompressRopeTheta = 0.5 }, `"compress_rope_theta" = 0.5: must be finite and greater than 1`},
		{"scaling type empty", func(c *Config) { c.RopeScaling.Type = "" }, `"rope_scaling.type" = "": must be "yarn"`},
		{"factor NaN", func(c *Config) { c.RopeScaling.Factor = math.NaN() }, `"rope_scaling.factor" = NaN: must be finite and at least 1`},
		{"original zero", func(c *Config) { c.RopeScaling.OriginalMaxPositionEmbeddings = 0 }, `"rope_scaling.original_max_position_embeddings" = 0: must be positive`},
		{"beta fast Inf", func(c *Config) { c.RopeScaling.BetaFast = math.Inf(1) }, `"rope_scaling.beta_fast" = +Inf: must be finite and positive`},
		{"betas equal", func(c *Config) { c.RopeScaling.BetaSlow = 32 }, `"rope_scaling.beta_fast" = 32: must exceed rope_scaling.beta_slow (32)`},
		{"mscale negative", func(c *Config) { c.RopeScaling.MScale = -1 }, `"rope_scaling.mscale" = -1: must be finite and 0 or positive`},
		{"mscale_all_dim NaN", func(c *Config) { c.RopeScaling.MScaleAllDim = math.NaN() }, `"rope_scaling.mscale_all_dim" = NaN: must be finite and 0 or positive`},
		// Betas so large that both correction dims fall below 0: the ramp
		// would run from 0 down to a negative high.
		{"empty correction range", func(c *Config) { c.RopeScaling.BetaFast, c.RopeScaling.BetaSlow = 1e301, 1e300 },
			`"rope_scaling.beta_fast" = 1e+301: gives an empty YaRN correction range [0, -`},
		{"ratios short", func(c *Config) { c.CompressRatios = c.CompressRatios[:40] }, `"compress_ratios": has 40 entries, want 43 (num_hidden_layers) to 44`},
		{"ratio negative", func(c *Config) { c.CompressRatios[7] = -1 }, `"compress_ratios[7]" = -1: must be 0 or positive`},
		{"ratios past the MTP layers", func(c *Config) { c.CompressRatios = append(c.CompressRatios, 0) }, `"compress_ratios": has 45 entries, want 43 (num_hidden_layers) to 44`},
		{"index heads zero", func(c *Config) { c.IndexNHeads = 0 }, `"index_n_heads" = 0: must be positive`},
		{"index head dim 64", func(c *Config) { c.IndexHeadDim = 64 }, `"index_head_dim" = 64: must be 128`},
		{"index topk zero", func(c *Config) { c.IndexTopK = 0 }, `"index_topk" = 0: must be positive`},
		{"block 32x32 (V4.1)", func(c *Config) { c.Quant.BlockRows, c.Quant.BlockCols = 32, 32 }, `"quantization_config.weight_block_size" = [32, 32]: must be [128, 128]`},
		{"fmt e5m2", func(c *Config) { c.Quant.Fmt = "e5m2" }, `"quantization_config.fmt" = "e5m2": must be "e4m3"`},
		{"no scale_fmt", func(c *Config) { c.Quant.ScaleFmt = "" }, `"quantization_config.scale_fmt" = "": must be "ue8m0"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Flash()
			tt.mutate(&c)
			err := c.Validate()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
			var fe *FieldError
			assert.ErrorAs(t, err, &fe)
		})
	}
}

func TestLayerRope(t *testing.T) {
	flash := Flash()
	mtpUnlisted := Flash()
	mtpUnlisted.CompressRatios = mtpUnlisted.CompressRatios[:43]
	ratioOne := Flash()
	ratioOne.CompressRatios[5] = 1

	tests := []struct {
		name    string
		cfg     Config
		layer   int
		want    RopeKind
		wantErr string
	}{
		{"flash layer 0", flash, 0, RopePlain, ""},
		{"flash layer 1", flash, 1, RopePlain, ""},
		{"flash layer 2 (ratio 4)", flash, 2, RopeYaRN, ""},
		{"flash layer 3 (ratio 128)", flash, 3, RopeYaRN, ""},
		{"flash last layer (ratio 4)", flash, 42, RopeYaRN, ""},
		{"flash MTP layer (ratio 0)", flash, 43, RopePlain, ""},
		{"MTP layer not listed", mtpUnlisted, 43, RopePlain, ""},
		{"ratio 1 is uncompressed", ratioOne, 5, RopePlain, ""},
		{"negative layer", flash, -1, 0, "dsv4: layer -1 out of range [0, 44) (43 layers + 1 MTP layers)"},
		{"past the MTP layer", flash, 44, 0, "dsv4: layer 44 out of range [0, 44)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.cfg.LayerRope(tt.layer)
			if tt.wantErr != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tt.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestRopeKindString(t *testing.T) {
	assert.Equal(t, "plain", RopePlain.String())
	assert.Equal(t, "yarn", RopeYaRN.String())
	assert.Equal(t, "RopeKind(0)", RopeKind(0).String())
}

// The index_* fields describe the ratio-4 layers' indexer: a model without
// such a layer needs none, and one with them refuses their absence.
func TestIndexerFieldsFollowRatio4(t *testing.T) {
	c := Flash()
	for i, r := range c.CompressRatios {
		if r == 4 {
			c.CompressRatios[i] = 128
		}
	}
	c.IndexNHeads, c.IndexHeadDim, c.IndexTopK = 0, 0, 0
	require.False(t, c.HasIndexer())
	require.NoError(t, c.Validate())
	c.CompressRatios[5] = 4
	require.True(t, c.HasIndexer())
	err := c.Validate()
	require.ErrorContains(t, err, `"index_n_heads" = 0: must be positive`)
	require.ErrorContains(t, err, `"index_head_dim" = 0: must be 128`)
	require.ErrorContains(t, err, `"index_topk" = 0: must be positive`)
}
