package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
)

// topkReading is one line BenchmarkCUDATopK logs: one shape's selection
// with one score kernel, in microseconds of device time a layer.
type topkReading struct {
	Batch   string // the shape before its context: "decode-b32-mtp3", "prefill=16K"
	Context int    // context tokens (ctx=64K is 65536); 0 where the shape names none
	TopK    int
	Kernel  string
	Us      float64 // the whole selection
	ScoreUs float64 // the score kernel alone
	// SelectUs is the select kernel alone; CacheBytes the indexer-cache
	// bytes the batch reads and CacheFloorUs them at the log's copy rate;
	// Int8FloorUs the score's multiply-adds at the int8 peak.
	SelectUs     float64
	CacheBytes   int64
	CacheFloorUs float64
	Int8FloorUs  float64
	Pairs        int64
}

// errTopKLine is a line that carries the benchmark's marker but not its form.
var errTopKLine = errors.New("malformed top-k benchmark line")

// topkMarker is in every line of the benchmark's and in no other.
const topkMarker = " us a layer (score alone "

// topkLineRE is the benchmark's line, after testing's "file.go:N: " prefix
// (present in `go test` output, absent where a script printed the line).
// The kernel is a score kernel with, after a "+", the select kernel
// ("mma4q+select2"; without one, the select the log's binary defaulted
// to). The floors come in the benchmark's form (the cache bytes and the
// row-entry pairs too) or in the short one the device scripts of
// 2026-12-02-h200-topkperf rewrote them to ("floors cache 9.90, int8
// 17.32", no bytes).
var topkLineRE = regexp.MustCompile(`^\s*(?:[\w.-]+\.go:\d+: )?(\S+)/topk=(\d+) ([\w+]+): ([\d.]+) us a layer \(score alone ([\d.]+), select alone ([\d.]+)\); ` +
	`(?:floors: cache (\d+) bytes ([\d.]+) us, int8 ([\d.]+) us \((\d+) row-entry pairs\)|floors cache ([\d.]+), int8 ([\d.]+))\s*$`)

// topkQuotedRE is topkLineRE after other text: a script's note quoting a
// reading ("ncu rc 0 (timeout 35s); decode-b32-mtp3/..." in
// 2026-12-02-h200-topkperf/call2.log: the benchmark run under the
// profiler, whose times are not the benchmark's).
var topkQuotedRE = regexp.MustCompile(`; ` + strings.TrimPrefix(topkLineRE.String(), `^\s*(?:[\w.-]+\.go:\d+: )?`))

// parseTopKLine reads one log line: ok is false for a line that is not the
// benchmark's (a quoted reading included), and the error is errTopKLine for
// one that has its marker but does not parse. A line in the short form
// leaves CacheBytes and Pairs 0.
func parseTopKLine(line string) (r topkReading, ok bool, err error) {
	if !strings.Contains(line, topkMarker) {
		return r, false, nil
	}
	m := topkLineRE.FindStringSubmatch(line)
	if m == nil {
		if topkQuotedRE.MatchString(line) {
			return r, false, nil
		}
		return r, false, fmt.Errorf("%w: %q", errTopKLine, strings.TrimSpace(line))
	}
	shape := m[1]
	r.Batch = shape
	if b, ctx, found := strings.Cut(shape, "/ctx="); found {
		r.Batch = b
		if r.Context, err = parseTokens(ctx); err != nil {
			return r, false, fmt.Errorf("%w: context %q: %v", errTopKLine, ctx, err)
		}
	}
	r.Kernel = m[3]
	cacheUs, int8Us := m[8], m[9]
	if m[7] == "" { // the short form
		cacheUs, int8Us = m[11], m[12]
	} else {
		ints := []struct {
			s   string
			dst *int64
		}{{m[7], &r.CacheBytes}, {m[10], &r.Pairs}}
		for _, f := range ints {
			if *f.dst, err = strconv.ParseInt(f.s, 10, 64); err != nil {
				return r, false, fmt.Errorf("%w: %v", errTopKLine, err)
			}
		}
	}
	if r.TopK, err = strconv.Atoi(m[2]); err != nil {
		return r, false, fmt.Errorf("%w: %v", errTopKLine, err)
	}
	floats := []struct {
		s   string
		dst *float64
	}{{m[4], &r.Us}, {m[5], &r.ScoreUs}, {m[6], &r.SelectUs}, {cacheUs, &r.CacheFloorUs}, {int8Us, &r.Int8FloorUs}}
	for _, f := range floats {
		if *f.dst, err = strconv.ParseFloat(f.s, 64); err != nil {
			return r, false, fmt.Errorf("%w: %v", errTopKLine, err)
		}
	}
	return r, true, nil
}

// parseTokens reads a token count as the benchmark names it: 8K, 1024K, 1M, 500.
func parseTokens(s string) (int, error) {
	mult := 1
	switch {
	case strings.HasSuffix(s, "K"):
		mult, s = 1<<10, strings.TrimSuffix(s, "K")
	case strings.HasSuffix(s, "M"):
		mult, s = 1<<20, strings.TrimSuffix(s, "M")
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("not a token count: %q", s)
	}
	return n * mult, nil
}

// topkLog is one benchmark log under the label its plot lines carry.
type topkLog struct {
	Label    string
	Readings []topkReading
}

// readTopKLog reads every benchmark line of a log; a malformed one is an
// error naming its line, as is a log without any.
func readTopKLog(path, label string) (topkLog, error) {
	f, err := os.Open(path)
	if err != nil {
		return topkLog{}, err
	}
	defer f.Close()
	lg := topkLog{Label: label}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		r, ok, err := parseTopKLine(sc.Text())
		if err != nil {
			return topkLog{}, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if ok {
			lg.Readings = append(lg.Readings, r)
		}
	}
	if err := sc.Err(); err != nil {
		return topkLog{}, fmt.Errorf("%s: %w", path, err)
	}
	if len(lg.Readings) == 0 {
		return topkLog{}, fmt.Errorf("%s: no BenchmarkCUDATopK lines", path)
	}
	return lg, nil
}

// leastAtTokens keeps the least value at each token count of a series
// sorted by tokens: the best of a shape's readings.
func leastAtTokens(s series) series {
	var out []point
	for _, p := range s.Points {
		switch n := len(out); {
		case n == 0 || out[n-1].Tokens != p.Tokens:
			out = append(out, p)
		case p.Us < out[n-1].Us:
			out[n-1] = p
		}
	}
	s.Points = out
	return s
}

// topkSeries is the selection against the context for one batch and
// index_topk: per log, one line per score kernel that kernels matches (all
// where it is nil; in the order the log names them) and one per select
// kernel among them, its time alone ("select alone" for the log's default
// select, "select alone (select2)" for a kernel named "mma4q+select2"),
// each point the best of its readings; then the two floors over every
// context any log has. The cache floor is redrawn from the bytes at the
// fastest copy rate any of the logs implies (bytes over its floor), so a
// log that divided by a slower rate (the bytes read, not moved:
// 2026-12-01-h200-topk) does not raise it. A reading in the short form
// (no bytes) takes the bytes of the same shape in any other reading (the
// benchmark draws a shape's batch from its name, so every log's is the
// same), and where none has them its own floor.
func topkSeries(logs []topkLog, batch string, topk int, kernels *regexp.Regexp) []series {
	type shape struct{ ctx, topk int }
	bytesOf := map[shape]int64{}
	for _, lg := range logs {
		for _, r := range lg.Readings {
			if r.Batch == batch && r.CacheBytes > 0 {
				bytesOf[shape{r.Context, r.TopK}] = r.CacheBytes
			}
		}
	}
	var lines, floors groupSeries // floors after every log's lines in the legend
	var kept []topkReading
	rate := 0.0 // bytes a microsecond
	for _, lg := range logs {
		var sel []topkReading
		for _, r := range lg.Readings {
			if r.Batch != batch || r.TopK != topk || r.Context <= 0 || (kernels != nil && !kernels.MatchString(r.Kernel)) {
				continue
			}
			if r.CacheBytes == 0 {
				r.CacheBytes = bytesOf[shape{r.Context, r.TopK}]
			}
			lines.add(fmt.Sprintf("%s, %s", r.Kernel, lg.Label), measured, r.Context, r.Us)
			sel = append(sel, r)
			if r.CacheFloorUs > 0 && r.CacheBytes > 0 {
				rate = math.Max(rate, float64(r.CacheBytes)/r.CacheFloorUs)
			}
		}
		for _, r := range sel { // after the log's kernels
			label := "select alone, " + lg.Label
			if _, s, found := strings.Cut(r.Kernel, "+"); found {
				label = fmt.Sprintf("select alone (%s), %s", s, lg.Label)
			}
			lines.add(label, measured, r.Context, r.SelectUs)
		}
		kept = append(kept, sel...)
	}
	cacheLabel := fmt.Sprintf("cache floor: the indexer-cache bytes at %.2f TB/s (the fastest copy in the logs)", rate/1e6)
	for _, r := range kept {
		switch {
		case rate > 0 && r.CacheBytes > 0:
			floors.add(cacheLabel, ceiling, r.Context, float64(r.CacheBytes)/rate)
		case r.CacheFloorUs > 0:
			floors.add(cacheLabel, ceiling, r.Context, r.CacheFloorUs)
		}
	}
	for _, r := range kept {
		floors.add(int8Label, ceiling, r.Context, r.Int8FloorUs)
	}
	out := append(lines.list(), floors.list()...)
	for i := range out {
		out[i] = leastAtTokens(out[i])
		switch out[i].Label {
		case cacheLabel:
			out[i].Color = color.Gray{Y: 120}
		case int8Label:
			out[i].Color = color.Black
		}
	}
	return out
}

const int8Label = "int8 floor: the score's multiply-adds at the int8 peak"

// topkMain is the topk subcommand: the indexer's top-k selection against
// the context, drawn from BenchmarkCUDATopK logs.
func topkMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench topk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var logs []string
	fs.Func("log", "a BenchmarkCUDATopK log, as PATH (labelled with its folder's name) or LABEL=PATH; repeat for several", func(s string) error {
		logs = append(logs, s)
		return nil
	})
	batch := fs.String("batch", "decode-b32-mtp3", "the batch shape, as the benchmark names it before /ctx=")
	topk := fs.Int("topk", 512, "index_topk")
	outDir := fs.String("out-dir", "", "where the plot goes (default: beside the last --log)")
	name := fs.String("name", "topk-vs-context", "file name: NAME.png and NAME.svg")
	kernels := fs.String("kernels", "", "a regular expression: draw only the kernels (as the logs name them: mma4q, mma4+radix) it matches")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("topk: unexpected argument %q", fs.Arg(0))
	}
	if len(logs) == 0 {
		return fmt.Errorf("topk: no --log given")
	}
	var match *regexp.Regexp
	if *kernels != "" {
		var err error
		if match, err = regexp.Compile(*kernels); err != nil {
			return fmt.Errorf("topk: --kernels: %w", err)
		}
	}
	var read []topkLog
	path := ""
	for _, s := range logs {
		label, p, found := strings.Cut(s, "=")
		if !found {
			p, label = s, filepath.Base(filepath.Dir(s))
		}
		lg, err := readTopKLog(p, label)
		if err != nil {
			return err
		}
		read = append(read, lg)
		path = p
	}
	ss := topkSeries(read, *batch, *topk, match)
	if !hasMeasured(ss) {
		return fmt.Errorf("topk: the logs have no %s at index_topk %d with a context", *batch, *topk)
	}
	dir := *outDir
	if dir == "" {
		dir = filepath.Dir(path)
	}
	base := filepath.Join(dir, *name)
	paths := []string{base + ".png", base + ".svg"}
	title := fmt.Sprintf("Indexer top-k selection, %s, index_topk %d: device time a layer (best of the readings)", *batch, *topk)
	if err := drawPlotAxes(title, "context tokens", "µs a layer", contextTicks(ss), ss, paths...); err != nil {
		return err
	}
	for _, f := range paths {
		fmt.Fprintln(stdout, "wrote", f)
	}
	return nil
}

// contextTicks marks the x axis at the contexts drawn, named as the
// benchmark names them (8K, 64K, 1M).
func contextTicks(ss []series) plot.ConstantTicks {
	var at []float64
	for _, s := range ss {
		for _, p := range s.Points {
			at = append(at, p.Tokens)
		}
	}
	slices.Sort(at)
	at = slices.Compact(at)
	ticks := make(plot.ConstantTicks, len(at))
	for i, x := range at {
		ticks[i] = plot.Tick{Value: x, Label: tokensLabel(int(x))}
	}
	return ticks
}

// tokensLabel is parseTokens' inverse: 1M, 64K, 500.
func tokensLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dK", n>>10)
	}
	return strconv.Itoa(n)
}
