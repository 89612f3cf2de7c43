package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// point is one measurement: microseconds at a token count.
type point struct{ Tokens, Us float64 }

// seriesKind says how a series is drawn.
type seriesKind int

const (
	measured seriesKind = iota // ours and the PyTorch peer: lines with points
	ceiling                    // the copy line: dashed, no points
	quoted                     // figures quoted from issue 11: large points, no line
)

// series is one labelled set of points, sorted by tokens.
type series struct {
	Label  string
	Kind   seriesKind
	Points []point
	Color  color.Color // a ceiling's colour where several must be told apart; nil: gray
}

// peerReport is the part of bench/peers.py's JSON the plots read.
type peerReport struct {
	LayerGraph []struct {
		Model      string   `json:"model"`
		Phase      string   `json:"phase"`
		MTP        int      `json:"mtp"`
		Tokens     int      `json:"tokens"`
		QFormat    string   `json:"q_format"`
		UsPerLayer *float64 `json:"us_per_layer"`
	} `json:"layer_graph"`
	// Chain is bench/chain_peer.py's: the PyTorch chain per layer.
	Chain []chainPeerEntry `json:"chain"`
	// Engines are bench/engines.py's timings (its own JSON, read by
	// readEngines): the serving engines' kernels measured in the same call.
	// Where a model has some, the quoted figures are left out.
	Engines []engineTiming `json:"-"`
}

// engineTiming is one shape of one engine in bench/engines.py's JSON: a
// layer's time and each of its kernels' (the names the plugin gave them),
// per layer of the many-layer graph.
type engineTiming struct {
	Engine  string
	Model   string
	Phase   string
	MTP     int
	Tokens  int
	Layer   float64            // 0 where the shape failed
	Kernels map[string]float64 // kernel name -> µs per layer
}

// readEngines reads bench/engines.py's JSON.
func readEngines(path string) ([]engineTiming, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Timings []map[string]json.RawMessage `json:"timings"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []engineTiming
	for _, t := range doc.Timings {
		e := engineTiming{Kernels: map[string]float64{}}
		for k, dst := range map[string]any{"engine": &e.Engine, "model": &e.Model, "phase": &e.Phase, "mtp": &e.MTP, "tokens": &e.Tokens} {
			if raw, ok := t[k]; ok {
				if err := json.Unmarshal(raw, dst); err != nil {
					return nil, fmt.Errorf("%s: timing %s: %w", path, k, err)
				}
			}
		}
		for k, raw := range t {
			var v float64
			if !strings.HasSuffix(k, "us_per_layer") || json.Unmarshal(raw, &v) != nil || v <= 0 {
				continue
			}
			switch kernel := strings.TrimSuffix(k, "_us_per_layer"); {
			case k == "us_per_layer":
				e.Layer = v
			case kernel == "back_to_back" || kernel == k:
			default:
				e.Kernels[kernel] = v
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// engineShort is an engine's name up to its first space (SGLang, vLLM).
func engineShort(name string) string {
	short, _, _ := strings.Cut(name, " ")
	return short
}

// measuredEngines reports whether bench/engines.py timed any engine on model.
func (p *peerReport) measuredEngines(model string) bool {
	if p == nil {
		return false
	}
	for _, e := range p.Engines {
		if e.Model == model && (e.Layer > 0 || len(e.Kernels) > 0) {
			return true
		}
	}
	return false
}

// chainPeerEntry is the part of a chain peer entry the plots read.
type chainPeerEntry struct {
	Model      string   `json:"model"`
	Phase      string   `json:"phase"`
	MTP        int      `json:"mtp"`
	Tokens     int      `json:"tokens"`
	UsPerLayer *float64 `json:"us_per_layer"`
}

// groupSeries collects points under labels, in the order labels first
// appear, each series sorted by tokens.
type groupSeries struct {
	order []string
	by    map[string]*series
}

func (g *groupSeries) add(label string, kind seriesKind, tokens int, us float64) {
	if us <= 0 || tokens <= 0 { // a log axis has no room for them; they are not measurements
		return
	}
	if g.by == nil {
		g.by = map[string]*series{}
	}
	s, ok := g.by[label]
	if !ok {
		s = &series{Label: label, Kind: kind}
		g.by[label] = s
		g.order = append(g.order, label)
	}
	s.Points = append(s.Points, point{float64(tokens), us})
}

func (g *groupSeries) list() []series {
	var out []series
	for _, l := range g.order {
		s := *g.by[l]
		slices.SortStableFunc(s.Points, func(a, b point) int { return cmp.Compare(a.Tokens, b.Tokens) })
		out = append(out, s)
	}
	return out
}

// dedupeTokens keeps the first point at each token count (the copy line
// of shapes that move the same bytes).
func dedupeTokens(s series) series {
	var out []point
	for _, p := range s.Points {
		if len(out) == 0 || out[len(out)-1].Tokens != p.Tokens {
			out = append(out, p)
		}
	}
	s.Points = out
	return s
}

// layerSeries is the per-layer view of a model: ours from the many-layer
// graphs (and one layer alone, cold), the copy line, the dependent-chain
// floor (ChainFloor), the PyTorch peer's graph, and the serving engines'
// figures: measured in the same call (peers.Engines), else quoted.
func layerSeries(rep *Report, peers *peerReport, model string) []series {
	var g groupSeries
	var copyLine groupSeries
	for _, lg := range rep.LayerGraphs {
		if lg.Model != model {
			continue
		}
		g.add(fmt.Sprintf("ours, graph, %s, %s Q", phaseLabel(lg.Phase, lg.MTP), lg.QFormat), measured, lg.Tokens, lg.UsPerLayer)
		if lg.QFormat == "fp8" {
			g.add(fmt.Sprintf("ours, one layer alone (cold L2), %s, fp8 Q", phaseLabel(lg.Phase, lg.MTP)), measured, lg.Tokens, lg.ColdLayerUs)
			copyLine.add("copy of the layer's bytes (fp8 Q)", ceiling, lg.Tokens, lg.CopyUsPerLayer)
		}
	}
	if peers != nil {
		for _, p := range peers.LayerGraph {
			if p.Model == model && p.UsPerLayer != nil {
				g.add(fmt.Sprintf("PyTorch, torch.compile in one graph, %s, %s Q", phaseLabel(p.Phase, p.MTP), p.QFormat), measured, p.Tokens, *p.UsPerLayer)
			}
		}
	}
	if peers.measuredEngines(model) {
		for _, e := range peers.Engines {
			if e.Model == model && e.Layer > 0 {
				g.add(fmt.Sprintf("%s, same call, graph, %s, bf16 Q", engineShort(e.Engine), phaseLabel(e.Phase, e.MTP)), measured, e.Tokens, e.Layer)
			}
		}
	} else {
		for _, q := range quotedFigures() {
			if q.What == "layer" && q.Model == model {
				g.add(q.Peer+" (quoted)", quoted, q.Tokens, q.Us)
			}
		}
	}
	if md, err := modelNamed(model); err == nil {
		for _, f := range rep.ChainFloors {
			if f.Model == model {
				name := "a copy kernel of the Q rows in the same graph (dependent-chain floor)"
				if f.Prefetch {
					name = "the same copy with the rows prefetched to L2 ahead of the wait"
				}
				copyLine.add(name, ceiling, f.Rows/md.Heads, f.UsPerLayer)
			}
		}
	}
	out := g.list()
	for _, s := range copyLine.list() {
		out = append(out, dedupeTokens(s))
	}
	return out
}

// chainSeries is the chain's per-layer view of a model: ours with the KV
// prologue forked and without it, the PyTorch chain peer, and the two
// floors (the weights alone, and weights plus the layer's I/O) at the copy
// rate.
func chainSeries(rep *Report, peers *peerReport, model string) []series {
	var g, floors groupSeries
	for _, r := range rep.Chain {
		if r.Model != model {
			continue
		}
		g.add(fmt.Sprintf("ours, KV forked, %s", phaseLabel(r.Phase, r.MTP)), measured, r.Tokens, r.UsPerLayer)
		g.add(fmt.Sprintf("ours, without the KV prologue, %s", phaseLabel(r.Phase, r.MTP)), measured, r.Tokens, r.NoKVUsPerLayer)
		floors.add("weight-streaming floor (weights at the copy rate)", ceiling, r.Tokens, r.WeightFloorUs)
		floors.add("floor: weights + hidden in + Q and cache out, at the copy rate", ceiling, r.Tokens, r.FloorUs)
	}
	if peers != nil {
		for _, p := range peers.Chain {
			if p.Model == model && p.UsPerLayer != nil {
				g.add(fmt.Sprintf("PyTorch chain (_scaled_mm + torch.compile, one graph), %s", phaseLabel(p.Phase, p.MTP)), measured, p.Tokens, *p.UsPerLayer)
			}
		}
	}
	out := g.list()
	for _, s := range floors.list() {
		out = append(out, dedupeTokens(s))
	}
	return out
}

// kernelSeries is the per-kernel view of a model: ours launched alone and
// cold and in a many-layer graph (generation at MTP 3 and context), each
// kernel's copy line, and the serving engines' kernels in the same graph
// setting: measured in the same call (peers.Engines), else quoted.
func kernelSeries(rep *Report, peers *peerReport, model string) []series {
	var g, copies groupSeries
	for _, r := range rep.Results {
		if r.Model != model || r.Variant != "" || (r.Phase == "generation" && r.MTP != 3) {
			continue
		}
		if r.Kernel == "kv" && r.Format != "fp8_ue8m0" {
			continue
		}
		name := strings.ToUpper(r.Kernel)
		g.add(fmt.Sprintf("ours %s, %s, cold", name, r.Format), measured, r.Tokens, r.Us)
		if rep.CopyGBps > 0 && r.Format != "bf16" {
			copies.add(fmt.Sprintf("copy of the %s bytes (%s)", name, r.Format), ceiling, r.Tokens, float64(r.Bytes)/rep.CopyGBps/1e3)
		}
	}
	for _, kg := range rep.KernelGraphs {
		if kg.Model != model || (kg.Phase == "generation" && kg.MTP != 3) {
			continue
		}
		g.add(fmt.Sprintf("ours %s, %s, many-layer graph", strings.ToUpper(kg.Kernel), kg.Format), measured, kg.Tokens, kg.UsPerLayer)
	}
	if peers.measuredEngines(model) {
		for _, e := range peers.Engines {
			if e.Model != model || (e.Phase == "generation" && e.MTP != 3) {
				continue
			}
			for k, us := range e.Kernels {
				g.add(fmt.Sprintf("%s %s, same call, many-layer graph", engineShort(e.Engine), k), measured, e.Tokens, us)
			}
		}
	} else {
		for _, q := range quotedFigures() {
			if q.What != "layer" && q.Model == model {
				g.add(fmt.Sprintf("%s %s (quoted)", q.Peer, strings.ToUpper(q.What)), quoted, q.Tokens, q.Us)
			}
		}
	}
	out := g.list()
	for _, s := range copies.list() {
		out = append(out, dedupeTokens(s))
	}
	return out
}

func phaseLabel(phase string, mtp int) string {
	if phase == "generation" {
		return fmt.Sprintf("generation MTP %d", mtp)
	}
	return phase
}

// drawPlot writes the series as a log-log plot to each path (the
// extension picks the format: .png, .svg, .pdf).
func drawPlot(title, ylabel string, ss []series, paths ...string) error {
	return drawPlotAxes(title, "tokens in the batch", ylabel, nil, ss, paths...)
}

// drawPlotAxes is drawPlot with the x axis named, and its ticks where
// xticks is not nil (powers of ten otherwise).
func drawPlotAxes(title, xlabel, ylabel string, xticks plot.Ticker, ss []series, paths ...string) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	if xticks != nil {
		p.X.Tick.Marker = xticks
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(7)
	p.Add(plotter.NewGrid())
	n := 0
	for i, s := range ss {
		if len(s.Points) == 0 {
			continue
		}
		n++
		xys := make(plotter.XYs, len(s.Points))
		for j, pt := range s.Points {
			xys[j] = plotter.XY{X: pt.Tokens, Y: pt.Us}
		}
		switch s.Kind {
		case ceiling:
			l, err := plotter.NewLine(xys)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Label, err)
			}
			l.Color = color.Gray{Y: 90}
			if s.Color != nil {
				l.Color = s.Color
			}
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			p.Add(l)
			p.Legend.Add(s.Label, l)
		case quoted:
			sc, err := plotter.NewScatter(xys)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Label, err)
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(i), Shape: draw.BoxGlyph{}, Radius: vg.Points(4)}
			p.Add(sc)
			p.Legend.Add(s.Label, sc)
		default:
			l, sc, err := plotter.NewLinePoints(xys)
			if err != nil {
				return fmt.Errorf("%s: %w", s.Label, err)
			}
			l.Color = plotutil.Color(i)
			l.Dashes = plotutil.Dashes(i / 7)
			sc.GlyphStyle = draw.GlyphStyle{Color: plotutil.Color(i), Shape: plotutil.Shape(i), Radius: vg.Points(2.5)}
			p.Add(l, sc)
			p.Legend.Add(s.Label, l, sc)
		}
	}
	if n == 0 {
		return fmt.Errorf("%s: nothing to plot", title)
	}
	// Room around the extreme points, which autoscaling puts on the frame.
	p.X.Min, p.X.Max, p.Y.Min, p.Y.Max = p.X.Min/1.5, p.X.Max*1.5, p.Y.Min/1.5, p.Y.Max*1.5
	for _, path := range paths {
		if err := p.Save(10*vg.Inch, 6.5*vg.Inch, path); err != nil {
			return err
		}
	}
	return nil
}

// modelTitle is the plot title's model name.
func modelTitle(m string) string {
	switch m {
	case "flash":
		return "V4-Flash"
	case "pro":
		return "V4-Pro"
	}
	return m
}

// writePlots draws, for every model of the report, the per-layer plot
// (when the report has many-layer graphs) and the per-kernel plot (when it
// has single launches), as PNG and SVG in dir; it returns the files.
func writePlots(rep *Report, peers *peerReport, dir, prefix string) ([]string, error) {
	var models []string
	seen := map[string]bool{}
	for _, r := range rep.Results {
		if !seen[r.Model] {
			seen[r.Model] = true
			models = append(models, r.Model)
		}
	}
	for _, lg := range rep.LayerGraphs {
		if !seen[lg.Model] {
			seen[lg.Model] = true
			models = append(models, lg.Model)
		}
	}
	for _, r := range rep.Chain {
		if !seen[r.Model] {
			seen[r.Model] = true
			models = append(models, r.Model)
		}
	}
	var files []string
	for _, m := range models {
		plots := []struct {
			name, title, ylabel string
			ss                  []series
		}{
			{"layer", modelTitle(m) + ": time per layer (Q + KV), " + rep.Device, "µs per layer", layerSeries(rep, peers, m)},
			{"kernels", modelTitle(m) + ": each kernel launched alone, L2 flushed, " + rep.Device, "µs per launch", kernelSeries(rep, peers, m)},
			{"chain", modelTitle(m) + ": the whole chain from hidden states per layer, " + rep.Device, "µs per layer", chainSeries(rep, peers, m)},
		}
		for _, pl := range plots {
			if !hasMeasured(pl.ss) {
				continue
			}
			base := filepath.Join(dir, fmt.Sprintf("%s-%s-%s", prefix, pl.name, m))
			paths := []string{base + ".png", base + ".svg"}
			if err := drawPlot(pl.title, pl.ylabel, pl.ss, paths...); err != nil {
				return nil, err
			}
			files = append(files, paths...)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("the report has no single launches and no layer graphs to plot, and no chain")
	}
	return files, nil
}

func hasMeasured(ss []series) bool {
	for _, s := range ss {
		if s.Kind == measured && len(s.Points) > 0 {
			return true
		}
	}
	return false
}

// reportMain is the report subcommand: the plots of a bench JSON (and
// optionally the PyTorch peers' JSON), written next to it.
func reportMain(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	goJSON := fs.String("go", "bench-go.json", "the JSON of a bench run")
	peersJSON := fs.String("peers", "", "bench/peers.py's JSON, for the PyTorch peer's graph (optional)")
	chainPeerJSON := fs.String("chain-peer", "", "bench/chain_peer.py's JSON, for the PyTorch chain (optional)")
	enginesJSON := fs.String("engines", "", "bench/engines.py's JSON: the serving engines measured in the same call, in place of the quoted figures (optional)")
	outDir := fs.String("out-dir", "", "where the plots go (default: beside --go)")
	prefix := fs.String("prefix", "bench", "file name prefix: PREFIX-layer-MODEL.png, PREFIX-kernels-MODEL.svg, ...")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("report: unexpected argument %q", fs.Arg(0))
	}
	rep, err := readReport(*goJSON)
	if err != nil {
		return err
	}
	var peers *peerReport
	if *peersJSON != "" {
		data, err := os.ReadFile(*peersJSON)
		if err != nil {
			return err
		}
		peers = &peerReport{}
		if err := json.Unmarshal(data, peers); err != nil {
			return fmt.Errorf("%s: %w", *peersJSON, err)
		}
	}
	if *chainPeerJSON != "" {
		data, err := os.ReadFile(*chainPeerJSON)
		if err != nil {
			return err
		}
		var cp peerReport
		if err := json.Unmarshal(data, &cp); err != nil {
			return fmt.Errorf("%s: %w", *chainPeerJSON, err)
		}
		if peers == nil {
			peers = &peerReport{}
		}
		peers.Chain = append(peers.Chain, cp.Chain...)
	}
	if *enginesJSON != "" {
		engines, err := readEngines(*enginesJSON)
		if err != nil {
			return err
		}
		if peers == nil {
			peers = &peerReport{}
		}
		peers.Engines = engines
	}
	dir := *outDir
	if dir == "" {
		dir = filepath.Dir(*goJSON)
	}
	files, err := writePlots(rep, peers, dir, *prefix)
	if err != nil {
		return err
	}
	for _, f := range files {
		fmt.Fprintln(stdout, "wrote", f)
	}
	fmt.Fprintln(stdout, "quoted peer figures:", quotedSource)
	return nil
}
