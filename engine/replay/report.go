package replay

import (
	"fmt"
	"github.com/dsv4mla/prologue/engine"
	"io"
	"runtime"
	"slices"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
)

// Report is a whole replay: the configuration, every line and a summary.
type Report struct {
	Backend     string `json:"backend"`
	Model       string `json:"model"`
	Layers      int    `json:"layers"`
	Heads       int    `json:"heads"`
	CacheFormat string `json:"cache_format"`
	PageSize    int    `json:"page_size"`
	Pages       int    `json:"pages"`
	QFormat     string `json:"q_format"`
	Seed        uint64 `json:"seed"`
	Verify      bool   `json:"verify"`
	UseGraphs   bool   `json:"use_graphs"`
	Input       string `json:"input"`                // hidden or projected (engine.Config.Input)
	HeadBegin   int    `json:"head_begin"`           // the engine's head range [HeadBegin, HeadEnd)
	HeadEnd     int    `json:"head_end"`             //
	Checkpoint  string `json:"checkpoint,omitempty"` // empty: synthetic weights (hidden input)
	Window      int    `json:"window"`               // the sliding window (engine.Config.Cache.Window), 0: none
	Compressor  bool   `json:"compressor"`           // the KV compressor and compressed caches run
	// Pools is every pool's occupancy when the report was taken.
	Pools []engine.PoolUsage `json:"pools"`
	// SequenceMemory is what one sequence holds between iterations at 1K,
	// 128K and 1M tokens, and at the trace's longest length so far.
	SequenceMemory []engine.SequenceMemory `json:"sequence_memory"`
	Iterations     []IterationReport       `json:"iterations"`
	Summary        Summary                 `json:"summary"`
}

// Summary aggregates the iterations of a report.
type Summary struct {
	Lines            int        `json:"lines"`
	Iterations       int        `json:"iterations"`
	ByKind           []KindStat `json:"by_kind"`
	ContextTokens    int        `json:"context_tokens"`
	GenerationTokens int        `json:"generation_tokens"`
	Launches         mla.Census `json:"launches"`
	WallNS           int64      `json:"wall_ns"`
	WallP50NS        int64      `json:"wall_p50_ns"`
	WallP99NS        int64      `json:"wall_p99_ns"`
	WallMaxNS        int64      `json:"wall_max_ns"`
	DeviceNS         int64      `json:"device_ns,omitempty"`
	HasDevice        bool       `json:"has_device"`
	TokensPerSecond  float64    `json:"tokens_per_second"` // real tokens over wall time
	// AcceptedTokens are the tokens the sequences kept (context tokens and
	// accepted generation tokens; rejected MTP drafts excluded), and
	// AcceptedPerSecond them over wall time: a server's throughput.
	AcceptedTokens    int     `json:"accepted_tokens"`
	AcceptedPerSecond float64 `json:"accepted_tokens_per_second"`
	// LongestSequence is the longest committed length of any sequence.
	LongestSequence int `json:"longest_sequence"`
	MinFreePages    int `json:"min_free_pages"`
	Finished        int `json:"finished"`
	Verified        int `json:"verified_iterations"`
	// TopKSelected is the iterations' IterationReport.TopKSelected.
	TopKSelected int `json:"topk_selected,omitempty"`
}

// KindStat aggregates the iterations of one batch shape.
type KindStat struct {
	Kind       string `json:"kind"` // context, generation or mixed
	Iterations int    `json:"iterations"`
	Tokens     int    `json:"tokens"`
	WallNS     int64  `json:"wall_ns"`
	DeviceNS   int64  `json:"device_ns,omitempty"`
}

func summarize(its []IterationReport, hasDevice bool) Summary {
	s := Summary{Lines: len(its), HasDevice: hasDevice, MinFreePages: -1}
	kinds := map[string]*KindStat{}
	var walls []int64
	for i := range its {
		ir := &its[i]
		s.Finished += len(ir.Finished)
		if s.MinFreePages < 0 || ir.FreePages < s.MinFreePages {
			s.MinFreePages = ir.FreePages
		}
		if !ir.Batch {
			continue
		}
		s.Iterations++
		s.ContextTokens += ir.ContextTokens
		s.GenerationTokens += ir.GenerationTokens
		s.AcceptedTokens += ir.AcceptedTokens
		s.TopKSelected += ir.TopKSelected
		s.Launches.ContextKV += ir.Launches.ContextKV
		s.Launches.ContextQ += ir.Launches.ContextQ
		s.Launches.GenerationKV += ir.Launches.GenerationKV
		s.Launches.GenerationQ += ir.Launches.GenerationQ
		s.WallNS += ir.WallNS
		s.DeviceNS += ir.DeviceNS
		walls = append(walls, ir.WallNS)
		if ir.Verified {
			s.Verified++
		}
		k := kinds[ir.Kind()]
		if k == nil {
			k = &KindStat{Kind: ir.Kind()}
			kinds[ir.Kind()] = k
		}
		k.Iterations++
		k.Tokens += ir.Tokens()
		k.WallNS += ir.WallNS
		k.DeviceNS += ir.DeviceNS
	}
	for _, name := range []string{"context", "generation", "mixed"} {
		if k := kinds[name]; k != nil {
			s.ByKind = append(s.ByKind, *k)
		}
	}
	if len(walls) > 0 {
		slices.Sort(walls)
		pct := func(p float64) int64 { return walls[min(len(walls)-1, int(p*float64(len(walls))))] }
		s.WallP50NS, s.WallP99NS, s.WallMaxNS = pct(0.5), pct(0.99), walls[len(walls)-1]
	}
	if s.WallNS > 0 {
		s.TokensPerSecond = float64(s.ContextTokens+s.GenerationTokens) / (float64(s.WallNS) / 1e9)
		s.AcceptedPerSecond = float64(s.AcceptedTokens) / (float64(s.WallNS) / 1e9)
	}
	if s.MinFreePages < 0 {
		s.MinFreePages = 0
	}
	return s
}

// benchName makes a value safe inside a benchmark name: no spaces, no '/'.
func benchName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '/' || r == '\t' || r == '=' {
			return '_'
		}
		return r
	}, s)
}

// WriteBenchmark writes the summary in the Go benchmark format, so that
// benchstat can compare two runs: one line for all iterations and one per
// batch shape, named BenchmarkDecode/model=.../backend=.../format=.../
// layers=.../batch=..., with N the iteration count, ns/op the mean wall time
// per iteration, ns/token, tokens/op and launches/op, plus device-ns/op
// when the backend measured device time.
func (rep *Report) WriteBenchmark(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/dsv4mla/prologue/cmd/decode\n", runtime.GOOS, runtime.GOARCH)
	s := rep.Summary
	prefix := fmt.Sprintf("BenchmarkDecode/model=%s/backend=%s/format=%s/layers=%d",
		benchName(rep.Model), benchName(rep.Backend), benchName(rep.CacheFormat), rep.Layers)
	line := func(kind string, n, tokens int, wall, device int64, launches int) {
		if n == 0 {
			return
		}
		fmt.Fprintf(&b, "%s/batch=%s-%d\t%d\t%.0f ns/op\t%.1f ns/token\t%.1f tokens/op\t%.1f launches/op",
			prefix, kind, runtime.GOMAXPROCS(0), n, float64(wall)/float64(n), float64(wall)/float64(max(tokens, 1)),
			float64(tokens)/float64(n), float64(launches)/float64(n))
		if s.HasDevice {
			fmt.Fprintf(&b, "\t%.0f device-ns/op", float64(device)/float64(n))
		}
		b.WriteByte('\n')
	}
	line("all", s.Iterations, s.ContextTokens+s.GenerationTokens, s.WallNS, s.DeviceNS, s.Launches.Total())
	for _, k := range s.ByKind {
		launches := 0
		for _, ir := range rep.Iterations {
			if ir.Batch && ir.Kind() == k.Kind {
				launches += ir.Launches.Total()
			}
		}
		line(k.Kind, k.Iterations, k.Tokens, k.WallNS, k.DeviceNS, launches)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
