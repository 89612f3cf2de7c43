package dsv4

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestParseValidTestdata parses every testdata/valid file and compares it
// with the embedded config its name starts with.
func TestParseValidTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/valid/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			var want Config
			switch name := filepath.Base(path); {
			case strings.HasPrefix(name, "flash_0731"):
				// The later revision lists three MTP layers (mtp.0..2),
				// each ratio 0, whatever num_nextn_predict_layers says.
				want = Flash()
				want.NumMTPLayers = 3
			case strings.HasPrefix(name, "flash"):
				want = Flash()
			case strings.HasPrefix(name, "pro"):
				want = Pro()
			default:
				t.Fatalf("%s: name must start with flash or pro to say which config it holds", name)
			}
			got, err := Load(path)
			require.NoError(t, err)
			assert.Equal(t, "deepseek_v4", got.Name, "Name comes from model_type")

			// A ratio list without the MTP entry is valid and means the
			// same layers, so compare per layer rather than the slices.
			for layer := range want.NumAttentionLayers() {
				wr, err := want.CompressRatio(layer)
				require.NoError(t, err)
				gr, err := got.CompressRatio(layer)
				require.NoError(t, err)
				assert.Equal(t, wr, gr, "compress ratio of layer %d", layer)
			}
			got.Name, got.CompressRatios = want.Name, want.CompressRatios
			assert.Equal(t, want, got)
		})
	}
}

// TestParseInvalidTestdata parses every testdata/invalid/NAME.json and
// expects an error containing each line of NAME.err.
func TestParseInvalidTestdata(t *testing.T) {
	files, err := filepath.Glob("testdata/invalid/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".json"), func(t *testing.T) {
			want, err := os.ReadFile(strings.TrimSuffix(path, ".json") + ".err")
			require.NoError(t, err, "every invalid config needs a .err file with the expected message")
			data, err := os.ReadFile(path)
			require.NoError(t, err)

			_, err = Parse(data)
			require.Error(t, err)
			for line := range strings.Lines(string(want)) {
				if line = strings.TrimSpace(line); line != "" {
					assert.Contains(t, err.Error(), line)
				}
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	data := []byte(`{"hidden_size": -1, "num_hidden_layers": 2, "num_attention_heads": "many",
		"q_lora_rank": 1024, "head_dim": 512, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-6,
		"rope_theta": 10000, "compress_rope_theta": 160000, "max_position_embeddings": 4096,
		"rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 4096,
		"beta_fast": 32, "beta_slow": 1}, "compress_ratios": [0, 4, 128],
		"index_n_heads": 64, "index_head_dim": 128, "index_topk": 512}`)
	_, err := Parse(data)
	require.Error(t, err)
	// The type error is found while parsing, so the range checks never run.
	assert.Contains(t, err.Error(), `"num_attention_heads" = "many": must be a number, found a string`)

	data = []byte(strings.Replace(string(data), `"many"`, `64`, 1))
	_, err = Parse(data)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"hidden_size" = -1: must be positive`)
	// A third entry for two layers lists an MTP layer, which must be 0.
	assert.Contains(t, err.Error(), `"compress_ratios[2]" = 128: must be 0: MTP layer 0 keeps only the sliding window`)

	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "hidden_size", fe.Field)
	assert.Equal(t, "-1", fe.Value)
}

func TestParseNameOrPath(t *testing.T) {
	data, err := os.ReadFile("testdata/valid/flash.json")
	require.NoError(t, err)
	named := strings.Replace(string(data), "{", `{"_name_or_path": "deepseek-ai/DeepSeek-V4-Flash",`, 1)
	c, err := Parse([]byte(named))
	require.NoError(t, err)
	assert.Equal(t, "deepseek-ai/DeepSeek-V4-Flash", c.Name)
}

func TestLoadErrors(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "config.json"))
	require.Error(t, err)
	assert.True(t, errors.Is(err, os.ErrNotExist), "got %v", err)

	_, err = Load("testdata/invalid/zero_eps.json")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "testdata/invalid/zero_eps.json: ")
	assert.Contains(t, err.Error(), `"rms_norm_eps" = 0`)
}

// FuzzParse checks that no input panics and that whatever Parse accepts is
// a config every other entry point accepts too.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"testdata/valid", "testdata/invalid"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.json"))
		if err != nil {
			f.Fatal(err)
		}
		for _, path := range files {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if err != nil {
			if c.NumLayers != 0 || c.CompressRatios != nil {
				t.Fatalf("Parse returned a partial config with error %v", err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config Validate refuses: %v", err)
		}
		if err := Diff(c, c); err != nil {
			t.Fatalf("an accepted config disagrees with itself: %v", err)
		}
		// Every layer compress_ratios lists is a layer of the model.
		if len(c.CompressRatios) > c.NumAttentionLayers() {
			t.Fatalf("compress_ratios lists %d layers, the model has %d", len(c.CompressRatios), c.NumAttentionLayers())
		}
		if c.HasIndexer() && (c.IndexNHeads <= 0 || c.IndexHeadDim != 128 || c.IndexTopK <= 0) {
			t.Fatalf("accepted indexer dimensions %d, %d, %d", c.IndexNHeads, c.IndexHeadDim, c.IndexTopK)
		}
		if c.Quant != FP8() {
			t.Fatalf("accepted quantization %+v", c.Quant)
		}
		positions := min(c.MaxPositionEmbeddings, 4)
		set, err := c.RopeTables(RopeReference, positions)
		if err != nil {
			t.Fatalf("RopeTables(%d) of an accepted config: %v", positions, err)
		}
		// num_nextn_predict_layers may be huge when compress_ratios
		// leaves the MTP layers out; the first unlisted one stands for all.
		for layer := range min(c.NumAttentionLayers(), len(c.CompressRatios)+1) {
			table, err := set.ForLayer(layer)
			if err != nil {
				t.Fatalf("ForLayer(%d): %v", layer, err)
			}
			if cos, sin := table.At(0, 0); cos != 1 || sin != 0 {
				t.Fatalf("layer %d: position 0 gives (%v, %v), want (1, 0)", layer, cos, sin)
			}
		}
	})
}
