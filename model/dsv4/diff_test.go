package dsv4

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDiff(t *testing.T) {
	require.NoError(t, Diff(Flash(), Flash()))
	require.NoError(t, Diff(Pro(), Pro()))

	// A list without the MTP entry means the same layers.
	unlisted := Flash()
	unlisted.CompressRatios = unlisted.CompressRatios[:43]
	require.NoError(t, Diff(Flash(), unlisted))
	unlisted.Name = "another name"
	require.NoError(t, Diff(Flash(), unlisted), "Name is not a model property")

	tests := []struct {
		name   string
		edit   func(*Config)
		fields []Mismatch
	}{
		{"rope_theta", func(c *Config) { c.RopeTheta = 50000 }, []Mismatch{{"rope_theta", "10000", "50000"}}},
		{"rms_norm_eps", func(c *Config) { c.RMSNormEps = 1e-5 }, []Mismatch{{"rms_norm_eps", "1e-06", "1e-05"}}},
		{"one ratio", func(c *Config) { c.CompressRatios[3] = 4 }, []Mismatch{{"compress_ratios[3]", "128", "4"}}},
		{"yarn beta", func(c *Config) { c.RopeScaling.BetaFast = 16 }, []Mismatch{{"rope_scaling.beta_fast", "32", "16"}}},
		{"index_topk", func(c *Config) { c.IndexTopK = 1024 }, []Mismatch{{"index_topk", "512", "1024"}}},
		{"block size", func(c *Config) { c.Quant.BlockRows, c.Quant.BlockCols = 32, 32 },
			[]Mismatch{{"quantization_config.weight_block_size", "[128, 128]", "[32, 32]"}}},
		{"0731's MTP layers", func(c *Config) { c.NumMTPLayers = 3; c.CompressRatios = append(c.CompressRatios, 0, 0) },
			[]Mismatch{{"num_nextn_predict_layers", "1", "3"}}},
		{"dims, in field order", func(c *Config) { c.QLoraRank = 1536; c.HiddenSize = 7168 },
			[]Mismatch{{"hidden_size", "4096", "7168"}, {"q_lora_rank", "1024", "1536"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := Flash()
			tt.edit(&b)
			err := Diff(Flash(), b)
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrMismatch))
			var me *MismatchError
			require.ErrorAs(t, err, &me)
			assert.Equal(t, tt.fields, me.Fields)
			for _, f := range tt.fields {
				assert.Contains(t, err.Error(), f.Field+" ("+f.A+" vs "+f.B+")")
			}
		})
	}
	// Flash against Pro: every dimension that differs, named.
	var me *MismatchError
	require.ErrorAs(t, Diff(Flash(), Pro()), &me)
	var names []string
	for _, f := range me.Fields[:4] {
		names = append(names, f.Field)
	}
	assert.Equal(t, []string{"hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank"}, names)
	assert.Equal(t, "index_topk", me.Fields[len(me.Fields)-1].Field)
}
