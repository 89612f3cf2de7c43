package replay

import (
	"bytes"
	"context"
	"encoding/binary"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/model/dsv4"
)

func TestActivations(t *testing.T) {
	const qLora, heads, tokens = 16, 3, 37
	f1, q1 := Activations(5, 2, 1, tokens, qLora, heads)
	require.Len(t, f1, tokens*(qLora+512)*2)
	require.Len(t, q1, tokens*heads*512*2)

	// The bytes do not depend on how many goroutines made them.
	prev := runtime.GOMAXPROCS(1)
	f2, q2 := Activations(5, 2, 1, tokens, qLora, heads)
	runtime.GOMAXPROCS(prev)
	require.Equal(t, f1, f2)
	require.Equal(t, q1, q2)

	// Another iteration, layer or seed gives other values.
	for _, o := range [][3]int{{6, 2, 1}, {5, 3, 1}, {5, 2, 0}} {
		f, _ := Activations(uint64(o[0]), o[1], o[2], tokens, qLora, heads)
		require.NotEqual(t, f1, f, "%v", o)
	}

	row := (qLora + 512) * 2
	exps := map[int]bool{}
	for tk := range tokens {
		for i := range qLora {
			require.Equal(t, uint16(PoisonBF16), binary.LittleEndian.Uint16(f1[tk*row+2*i:]))
		}
		for i := qLora; i < qLora+512; i++ {
			v := binary.LittleEndian.Uint16(f1[tk*row+2*i:])
			e := int(v>>7&0xFF) - 127
			require.True(t, e >= -12 && e <= 11, "exponent %d out of the documented range", e)
			exps[e] = true
		}
	}
	require.Greater(t, len(exps), 15, "magnitudes vary")
}

func TestDescribe(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{describeQ(0, 4, 1), "token row 0, head 0, nope element 0"},
		{describeQ(3*4*512+2*512+450, 4, 1), "token row 3, head 2, rope element 450"},
		{describeQ(2*(4*512+100), 4, 2), "token row 1, head 0, nope element 100"},
		{describePage(576*3+70, kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64}), "token offset 3, e4m3 nope value 70 (group 1)"},
		{describePage(576*3+448+6, kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64}), "token offset 3, bf16 rope value 3"},
		{describePage(576*64+8*5+2, kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64}), "token offset 5, UE8M0 exponent of nope group 2"},
		{describePage(576*64+8*5+7, kvcache.Config{Format: kvcache.FormatFP8UE8M0, PageSize: 64}), "token offset 5, scale padding byte (never written)"},
		{describePage(1024*2+900, kvcache.Config{Format: kvcache.FormatBF16, PageSize: 64}), "token offset 2, bf16 rope value 450"},
		{describePage(512*9+3, kvcache.Config{Format: kvcache.FormatFP8PerTensor, PageSize: 16}), "token offset 9, fp8 nope value 3"},
	} {
		require.Equal(t, c.want, c.got)
	}
}

func smallOptions(verify bool) Options {
	m := dsv4.Flash()
	m.NumHeads = 2
	return Options{
		Engine: engine.Config{
			SyntheticWeights: &engine.SyntheticWeights{},
			Model:            m, Cache: kvcache.Config{PageSize: 16, NumPages: 64},
			Backend: engine.BackendCPU, Layers: 3, MaxSeqs: 8, MaxTokens: 128,
			Input:      engine.InputProjected,
			FullCache:  true,
			Compressor: engine.CompressorConfig{Off: true},
			Eager:      true,
		},
		Seed:   3,
		Verify: verify,
	}
}

func smallTrace(t *testing.T) []trace.Step {
	steps, err := trace.Parse(strings.NewReader(`
{"context":[{"seq":1,"tokens":40},{"seq":2,"tokens":9}]}
{"context":[{"seq":1,"tokens":30}],"generation":{"mtp":2,"seqs":[2]}}
{"generation":{"mtp":2,"seqs":[1,2]},"finish":[2]}
{"finish":[1]}
`))
	require.NoError(t, err)
	return steps
}

func TestRunReportAndBenchmarkFormat(t *testing.T) {
	r, err := New(context.Background(), smallOptions(true))
	require.NoError(t, err)
	defer r.Close()
	var seen []int
	rep, err := r.Run(context.Background(), smallTrace(t), func(ir *IterationReport) { seen = append(seen, ir.Line) })
	require.NoError(t, err)
	require.Equal(t, []int{2, 3, 4, 5}, seen)
	s := rep.Summary
	require.Equal(t, 4, s.Lines)
	require.Equal(t, 3, s.Iterations)
	require.Equal(t, 3, s.Verified)
	require.Equal(t, 49+30, s.ContextTokens)
	require.Equal(t, 3+6, s.GenerationTokens)
	require.Equal(t, 2, s.Finished)
	// 3 layers: 1 context launch, 1 mixed pair, 1 generation launch.
	require.Equal(t, 3*2, s.Launches.ContextKV)
	require.Equal(t, 3*2, s.Launches.GenerationQ)
	require.Equal(t, []string{"context", "generation", "mixed"}, []string{s.ByKind[0].Kind, s.ByKind[1].Kind, s.ByKind[2].Kind})
	require.Equal(t, 64, rep.Iterations[3].FreePages)
	require.Equal(t, -1, rep.Iterations[3].Index)

	var buf bytes.Buffer
	require.NoError(t, rep.WriteBenchmark(&buf))
	// The lines benchstat reads: name-procs, N, then value-unit pairs.
	re := regexp.MustCompile(`^BenchmarkDecode/model=DeepSeek-V4-Flash/backend=cpu/format=fp8_ue8m0/layers=3/batch=(all|context|generation|mixed)-\d+\t(\d+)(\t[0-9.]+ [a-z/-]+)+$`)
	var n int
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if strings.HasPrefix(l, "Benchmark") {
			require.Regexp(t, re, l)
			n++
		}
	}
	require.Equal(t, 4, n, buf.String())
}
