package weights

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/internal/race"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// copyCheckpoint copies a template checkpoint so that a case may edit it.
func copyCheckpoint(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "ck")
	require.NoError(t, os.CopyFS(dst, os.DirFS(src)))
	return dst
}

func dtypeSize(dt string) int {
	switch dt {
	case dtF32:
		return 4
	case dtBF16:
		return 2
	}
	return 1
}

// TestValuesChecked poisons one element of every kind of tensor the loader
// reads (and a later element too, so that the first is the one named) with
// each kind of bad value its dtype can hold, and expects a *TensorError
// naming the tensor, its file and the first bad element's index, wrapping
// the condition's sentinel.
func TestValuesChecked(t *testing.T) {
	cfg := TinyConfig() // layer 1 is ratio 4: every kind of tensor
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 26))
	templates := map[ScaleFormat]string{
		ScaleF32:  write(t, cfg, seed, SyntheticOptions{ScaleFormat: ScaleF32, LayersPerShard: 1}),
		ScaleE8M0: write(t, cfg, seed, SyntheticOptions{ScaleFormat: ScaleE8M0, LayersPerShard: 1}),
	}
	f32 := func(v float32) []byte { return binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)) }
	bf16 := func(u uint16) []byte { return binary.LittleEndian.AppendUint16(nil, u) }
	nan32, inf := float32(math.NaN()), float32(math.Inf(1))
	// The e4m3 weights: 0x7F and 0xFF are e4m3fn's NaNs.
	var cases []struct {
		name     string
		format   ScaleFormat
		tensor   string
		retype   string // rewrite the tensor in this dtype first ("" keeps it)
		bad      []byte // one element's bytes
		value    string // how the error prints it
		sentinel error
	}
	add := func(format ScaleFormat, tensor, retype string, bad []byte, value string, sentinel error) {
		cases = append(cases, struct {
			name     string
			format   ScaleFormat
			tensor   string
			retype   string
			bad      []byte
			value    string
			sentinel error
		}{fmt.Sprintf("%s/%s/%s/%x", tensor, format, retype, bad), format, tensor, retype, bad, value, sentinel})
	}
	const l = "layers.1.attn."
	for k, name := range []string{"wq_a", "wkv", "wq_b", "indexer.wq_b"} {
		add(ScaleF32, l+name+".weight", "", []byte{[]byte{0x7F, 0xFF}[k%2]}, "the e4m3 NaN byte", ErrNonFinite)
		add(ScaleE8M0, l+name+".weight", "", []byte{[]byte{0xFF, 0x7F}[k%2]}, "the e4m3 NaN byte", ErrNonFinite)
		add(ScaleE8M0, l+name+".scale", "", []byte{0xFF}, "the e8m0 NaN byte 0xFF", ErrBadScale)
		for _, v := range []float32{nan32, inf, -inf, 0, float32(math.Copysign(0, -1)), -0.5} {
			add(ScaleF32, l+name+".scale", "", f32(v), fmt.Sprintf(" is %v: ", v), ErrBadScale)
		}
	}
	for k, name := range []string{"q_norm.weight", "kv_norm.weight", "compressor.wkv.weight", "compressor.wgate.weight",
		"compressor.norm.weight", "indexer.weights_proj.weight", "indexer.compressor.wkv.weight",
		"indexer.compressor.wgate.weight", "indexer.compressor.norm.weight"} {
		bad := []struct {
			u uint16
			v string
		}{{0x7FC0, "NaN"}, {0x7F80, "+Inf"}, {0xFF80, "-Inf"}, {0xFFC1, "NaN"}}[k%4]
		add(ScaleF32, l+name, "", bf16(bad.u), " is "+bad.v+": ", ErrNonFinite)
	}
	for _, name := range []string{"compressor.ape", "indexer.compressor.ape"} {
		add(ScaleF32, l+name, "", f32(nan32), " is NaN: ", ErrNonFinite)
		add(ScaleE8M0, l+name, "", f32(-inf), " is -Inf: ", ErrNonFinite)
	}
	// The loader also takes F32 norms and BF16 ape.
	add(ScaleF32, l+"q_norm.weight", dtF32, f32(inf), " is +Inf: ", ErrNonFinite)
	add(ScaleF32, l+"indexer.compressor.norm.weight", dtF32, f32(nan32), " is NaN: ", ErrNonFinite)
	add(ScaleF32, l+"compressor.ape", dtBF16, bf16(0x7F80), " is +Inf: ", ErrNonFinite)

	// Under the race detector a third of the cases, a different third each
	// seed (each case loads a whole checkpoint; the full run, .ci/run's
	// second step, checks them all).
	skip := int(seed % 3)
	for i, c := range cases {
		if race.Enabled && i%3 != skip {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			dir := copyCheckpoint(t, templates[c.format])
			var n, first int
			file := rewriteShard(t, dir, c.tensor, editTensor(c.tensor, func(x *safetensors.Tensor) {
				if c.retype != "" {
					x.Data = retype(x.DType, c.retype, x.Data)
					x.DType = c.retype
				}
				size := dtypeSize(x.DType)
				n = len(x.Data) / size
				first = rng.IntN(n)
				copy(x.Data[first*size:], c.bad)
				if later := first + 1 + rng.IntN(n-first); later < n {
					copy(x.Data[later*size:], c.bad)
				}
			}))
			t.Logf("%s: %d elements, the first bad one at %d", c.tensor, n, first)
			ck, err := Load(dir, nil, LoadOptions{Layers: []int{1}})
			require.Nil(t, ck)
			require.ErrorIs(t, err, c.sentinel)
			var te *TensorError
			require.ErrorAs(t, err, &te)
			require.Equal(t, c.tensor, te.Tensor)
			require.Equal(t, file, te.File)
			require.Contains(t, err.Error(), fmt.Sprintf("element %d ", first))
			require.Contains(t, err.Error(), c.value)
			require.Contains(t, err.Error(), file)
		})
	}
}

// retype rewrites a tensor's bytes from one float dtype to another.
func retype(from, to string, b []byte) []byte {
	switch {
	case from == dtBF16 && to == dtF32:
		out := make([]byte, 0, 2*len(b))
		for x := 0; x < len(b); x += 2 {
			out = binary.LittleEndian.AppendUint32(out, uint32(binary.LittleEndian.Uint16(b[x:]))<<16)
		}
		return out
	case from == dtF32 && to == dtBF16:
		out := make([]byte, 0, len(b)/2)
		for x := 0; x < len(b); x += 4 {
			out = binary.LittleEndian.AppendUint16(out, uint16(binary.LittleEndian.Uint32(b[x:])>>16))
		}
		return out
	}
	panic(from + " -> " + to)
}

// With a head range only its rows of wq_b are read, so only they are
// checked, and a bad element is named by its index in the whole tensor.
func TestValuesCheckedInHeadRange(t *testing.T) {
	cfg := oddConfig() // 3 heads: wq_b [1536][192]
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, 27))
	dir := write(t, cfg, seed, SyntheticOptions{})
	const name = "layers.0.attn.wq_b.weight"
	row := 512 + rng.IntN(512) // in head 1
	col := rng.IntN(192)
	rewriteShard(t, dir, name, editTensor(name, func(x *safetensors.Tensor) { x.Data[row*192+col] = 0x7F }))
	for _, h := range []HeadRange{{0, 1}, {2, 3}} {
		_, err := Load(dir, nil, LoadOptions{Layers: []int{0}, Heads: h})
		require.NoError(t, err, "head range %v does not read head 1's rows", h)
	}
	_, err := Load(dir, nil, LoadOptions{Layers: []int{0}, Heads: HeadRange{1, 3}})
	require.ErrorIs(t, err, ErrNonFinite)
	require.ErrorContains(t, err, fmt.Sprintf("element %d (row %d, column %d) is the e4m3 NaN byte 0x7f", row*192+col, row, col))
}

func TestCheckFinite(t *testing.T) {
	seed := uint64(0x26f1)
	t.Logf("seed %#x", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	v := make([]float32, 512)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	v[7] = math.MaxFloat32
	v[8] = math.SmallestNonzeroFloat32
	v[9] = float32(math.Copysign(0, -1))
	require.NoError(t, CheckFinite("kv_norm", v))
	require.NoError(t, CheckFinite("empty", nil))
	for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.Float32frombits(0xFFC00001)} {
		w := append([]float32(nil), v...)
		at := rng.IntN(len(w))
		w[at] = bad
		w[len(w)-1] = bad
		err := CheckFinite("layer 3 kv_norm", w)
		require.ErrorIs(t, err, ErrNonFinite)
		require.ErrorContains(t, err, fmt.Sprintf("weights: layer 3 kv_norm: element %d is %v", at, bad))
	}
}

func TestCheckConfig(t *testing.T) {
	cfg := TinyConfig()
	dir := write(t, cfg, testSeed(t), SyntheticOptions{Layers: []int{0}})
	require.NoError(t, CheckConfig(dir, cfg))
	other := cfg
	other.RopeTheta = 50000
	other.IndexTopK = 1024
	err := CheckConfig(dir, other)
	require.ErrorIs(t, err, dsv4.ErrMismatch)
	require.ErrorContains(t, err, "rope_theta (50000 vs 10000), index_topk (1024 vs 512)")
	require.ErrorContains(t, err, filepath.Join(dir, ConfigFile))
	// Load with a config that disagrees refuses the same way.
	_, err = Load(dir, &other, LoadOptions{Layers: []int{0}})
	require.ErrorIs(t, err, dsv4.ErrMismatch)

	require.NoError(t, os.Remove(filepath.Join(dir, ConfigFile)))
	require.ErrorIs(t, CheckConfig(dir, cfg), os.ErrNotExist)
}

// Symbolic links are followed wherever they point (a HuggingFace hub
// snapshot links every file into ../../blobs/); what they point at must be
// a regular file.
func TestSymlinks(t *testing.T) {
	cfg := TinyConfig()
	seed := testSeed(t)
	src := write(t, cfg, seed, SyntheticOptions{LayersPerShard: 2})
	// A hub-cache layout: blobs/ holds the files, snapshots/rev/ links to them.
	root := t.TempDir()
	blobs, snap := filepath.Join(root, "blobs"), filepath.Join(root, "snapshots", "rev")
	require.NoError(t, os.MkdirAll(blobs, 0o755))
	require.NoError(t, os.MkdirAll(snap, 0o755))
	entries, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range entries {
		require.NoError(t, os.Rename(filepath.Join(src, e.Name()), filepath.Join(blobs, "sha-"+e.Name())))
		if err := os.Symlink(filepath.Join("..", "..", "blobs", "sha-"+e.Name()), filepath.Join(snap, e.Name())); err != nil {
			t.Skipf("symbolic links unsupported here: %v", err)
		}
	}
	ck, err := Load(snap, nil, LoadOptions{MTP: true})
	require.NoError(t, err, "links pointing outside the checkpoint directory are followed")
	for _, l := range ck.Layers {
		want, err := SyntheticLayer(&cfg, seed, l.Index, ScaleF32)
		require.NoError(t, err)
		require.Equal(t, want, l)
	}

	// A link to a directory, or a dangling one, is refused naming the shard.
	shard := "model-00001-of-00002.safetensors"
	require.NoError(t, os.Remove(filepath.Join(snap, shard)))
	require.NoError(t, os.Symlink(blobs, filepath.Join(snap, shard)))
	_, err = Load(snap, nil, LoadOptions{})
	require.ErrorIs(t, err, ErrNotRegular)
	require.ErrorContains(t, err, shard)
	require.NoError(t, os.Remove(filepath.Join(snap, shard)))
	require.NoError(t, os.Symlink(filepath.Join(blobs, "gone"), filepath.Join(snap, shard)))
	_, err = Load(snap, nil, LoadOptions{})
	require.ErrorIs(t, err, os.ErrNotExist)
	var te *TensorError
	require.ErrorAs(t, err, &te)
	require.Equal(t, shard, te.File)
	require.True(t, strings.HasPrefix(te.Tensor, "layers.0."), te.Tensor)
	require.False(t, errors.Is(err, ErrNonFinite))
}
