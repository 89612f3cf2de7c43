package replay

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/weights"
)

// Options configure a Replayer.
type Options struct {
	// Engine is the engine to replay on. Size MaxSeqs and MaxTokens to the
	// trace (trace.Summarize) or the largest line is refused.
	Engine engine.Config
	// Seed seeds the synthetic activations (see Activations).
	Seed uint64
	// Verify runs every iteration on a second engine with the cpu backend
	// and the same configuration and inputs, and compares the results.
	Verify bool
	// DumpDir, when set, receives a safetensors file for every iteration
	// and layer that DumpIteration and DumpLayer select (nil selects all).
	DumpDir       string
	DumpIteration func(index int) bool
	DumpLayer     func(layer int) bool
	Logger        zerolog.Logger
}

// Replayer replays trace steps on an engine.
type Replayer struct {
	opts   Options
	log    zerolog.Logger
	eng    *engine.Engine
	ref    *engine.Engine
	timer  engine.EventTimer
	timed  bool
	report Report
	// longest is the longest sequence replayed so far, in tokens.
	longest int
	// weights caches the reference engine's GEMM weights per layer (the
	// chain's verify bounds the engine's GEMM outputs with them).
	weights map[int]*[2]weights.FP8Matrix
	// projections caches the reference engine's compressor projection
	// weights per layer, read once.
	projections map[int]*compressor.Projection
}

// New creates the engine (and the reference engine when verifying).
func New(ctx context.Context, opts Options) (*Replayer, error) {
	r := &Replayer{opts: opts, log: opts.Logger.With().Str("component", "replay").Logger(), weights: map[int]*[2]weights.FP8Matrix{},
		projections: map[int]*compressor.Projection{}}
	var err error
	if r.eng, err = engine.New(ctx, opts.Engine); err != nil {
		return nil, err
	}
	r.timer, r.timed = r.eng.EventTimer()
	if opts.Verify {
		rc := opts.Engine
		rc.Backend = engine.BackendCPU
		rc.Logger = opts.Logger.With().Str("engine", "reference").Logger()
		if r.ref, err = engine.New(ctx, rc); err != nil {
			r.eng.Close()
			return nil, fmt.Errorf("replay: reference engine: %w", err)
		}
	}
	if opts.DumpDir != "" {
		if err := os.MkdirAll(opts.DumpDir, 0o755); err != nil {
			r.Close()
			return nil, fmt.Errorf("replay: dump directory: %w", err)
		}
	}
	cfg := r.eng.Config()
	r.report = Report{
		Backend:     r.eng.Backend().Name(),
		Model:       cfg.Model.Name,
		Layers:      cfg.Layers,
		Heads:       cfg.Model.NumHeads,
		CacheFormat: cfg.Cache.Format.String(),
		PageSize:    cfg.Cache.PageSize,
		Pages:       cfg.Cache.NumPages,
		QFormat:     cfg.QFormat.String(),
		Seed:        opts.Seed,
		Verify:      opts.Verify,
		UseGraphs:   !cfg.Eager,
		Input:       cfg.Input.String(),
		HeadBegin:   cfg.HeadBegin,
		HeadEnd:     cfg.HeadEnd,
		Checkpoint:  cfg.Checkpoint,
		Window:      cfg.Cache.Window,
		Compressor:  cfg.Compresses(),
	}
	return r, nil
}

// Engine is the engine under test.
func (r *Replayer) Engine() *engine.Engine { return r.eng }

// Reference is the cpu reference engine; nil unless Options.Verify.
func (r *Replayer) Reference() *engine.Engine { return r.ref }

// Close closes the engines.
func (r *Replayer) Close() error {
	var errs []error
	if r.eng != nil {
		errs = append(errs, r.eng.Close())
	}
	if r.ref != nil {
		errs = append(errs, r.ref.Close())
	}
	return errors.Join(errs...)
}

// Run replays steps in order, calling onIteration (when not nil) after each
// one. It stops at the first error, a *trace.LineError (wrapping a
// *VerifyError for a verify failure); the report covers the lines replayed
// before it.
func (r *Replayer) Run(ctx context.Context, steps []trace.Step, onIteration func(*IterationReport)) (*Report, error) {
	for _, s := range steps {
		ir, err := r.Step(ctx, s)
		if err != nil {
			rep := r.Report()
			return rep, err
		}
		if onIteration != nil {
			onIteration(ir)
		}
	}
	return r.Report(), nil
}

// Report returns the report of the lines replayed so far.
func (r *Replayer) Report() *Report {
	rep := r.report
	rep.Iterations = append([]IterationReport(nil), r.report.Iterations...)
	rep.Summary = summarize(rep.Iterations, r.timed)
	rep.Summary.LongestSequence = r.longest
	rep.Pools = r.eng.Pools()
	rep.SequenceMemory = nil
	for _, n := range []int{1 << 10, 128 << 10, 1 << 20, r.longest} {
		if m, err := r.eng.Config().SequenceMemory(n); err == nil {
			rep.SequenceMemory = append(rep.SequenceMemory, m)
		}
	}
	return &rep
}

// Step replays one line: its batch as one iteration, then its finishes. On
// an error the cache is as the previous line left it.
func (r *Replayer) Step(ctx context.Context, s trace.Step) (*IterationReport, error) {
	lineErr := func(err error) error { return &trace.LineError{Line: s.Line, Err: err} }
	if err := s.Validate(); err != nil {
		return nil, lineErr(err)
	}
	// Check the finishes first, so a bad one refuses the whole line.
	inBatch := map[uint64]bool{}
	for _, q := range s.Requests() {
		inBatch[q.Seq] = true
	}
	for i, seq := range s.Finish {
		if inBatch[seq] {
			continue
		}
		if _, err := r.eng.SequenceLength(seq); err != nil {
			return nil, lineErr(fmt.Errorf("finish[%d]: %w", i, err))
		}
	}
	ir := &IterationReport{Index: -1, Line: s.Line}
	if s.HasBatch() {
		if err := r.iterate(ctx, s, ir); err != nil {
			return nil, lineErr(err)
		}
	}
	for _, q := range s.Requests() { // before the finishes, which forget the lengths
		if n, err := r.eng.SequenceLength(q.Seq); err == nil {
			r.longest = max(r.longest, n)
		}
	}
	for _, seq := range s.Finish {
		if err := r.eng.Finish(seq); err != nil {
			return nil, lineErr(err)
		}
		if r.ref != nil {
			if err := r.ref.Finish(seq); err != nil {
				return nil, lineErr(fmt.Errorf("reference engine: %w", err))
			}
		}
	}
	ir.Finished = append([]uint64(nil), s.Finish...)
	ir.FreePages = r.eng.FreePages()
	r.report.Iterations = append(r.report.Iterations, *ir)
	return ir, nil
}

// iterate runs the batch of s on the engine (and the reference).
func (r *Replayer) iterate(ctx context.Context, s trace.Step, ir *IterationReport) (err error) {
	reqs := s.Requests()
	var wall time.Duration
	timed := func(f func() error) error {
		start := time.Now()
		err := f()
		wall += time.Since(start)
		return err
	}
	var it, rit *engine.Iteration
	if err := timed(func() (err error) { it, err = r.eng.Begin(ctx, reqs); return err }); err != nil {
		return err
	}
	defer it.Abort() // does nothing once End succeeded
	if r.ref != nil {
		if rit, err = r.ref.Begin(ctx, reqs); err != nil {
			return fmt.Errorf("reference engine refused a batch the engine took: %w", err)
		}
		defer rit.Abort()
	}
	m := it.Metadata()
	ir.Index = it.Index()
	ir.Batch = true
	ir.ContextSeqs, ir.ContextTokens = m.NumCtx, m.CtxTokens
	ir.GenerationSeqs, ir.GenerationTokens = m.NumGen, m.GenTokens
	ir.AcceptedTokens = m.CtxTokens
	if g := s.Generation; g != nil {
		for i := range g.Seqs {
			if g.Accept != nil {
				ir.AcceptedTokens += g.Accept[i]
			} else {
				ir.AcceptedTokens += 1 + g.MTP
			}
		}
	}
	if m.NumGen > 0 {
		ir.MTP = m.GenSeqLen - 1
	}
	ir.Rows = m.PaddedTokens
	ir.HasDevice = r.timed
	if k := r.eng.IndexTopK(); k > 0 {
		// What the selections keep, from the positions: each row selects
		// min(index_topk, floor((p+1)/4)) entries in each ratio-4 layer.
		per := 0
		for row := range m.Tokens {
			_, pos, _ := m.Row(row)
			per += min(k, mla.TopKVisible(pos))
		}
		for l := range r.eng.Layers() {
			if r.eng.RunsIndexer(l) {
				ir.TopKSelected += per
			}
		}
	}
	cfg := r.eng.Config()
	backend := r.eng.Backend()
	hiddenInput := cfg.Input == engine.InputHidden
	for layer := range r.eng.Layers() {
		var fused, q, hidden, ck, cg []byte
		if hiddenInput {
			hidden = HiddenStates(r.opts.Seed, it.Index(), layer, it.Tokens(), cfg.Model.HiddenSize)
			if err := it.SetHidden(layer, hidden); err != nil {
				return err
			}
		} else {
			fused, q = Activations(r.opts.Seed, it.Index(), layer, it.Tokens(), cfg.Model.QLoraRank, r.eng.Heads())
			if err := it.SetInputs(layer, fused, q); err != nil {
				return err
			}
			if w := r.eng.CompressorWidth(layer); w > 0 {
				ck, cg = CompressorActivations(r.opts.Seed, it.Index(), layer, it.Tokens(), w)
				if err := it.SetCompressorInputs(layer, ck, cg); err != nil {
					return err
				}
			}
		}
		err := timed(func() error {
			if !r.timed {
				if err := it.RunLayer(ctx, layer); err != nil {
					return err
				}
				return backend.Synchronize(ctx)
			}
			d, err := r.timer.Time(ctx, func() error { return it.RunLayer(ctx, layer) })
			ir.DeviceNS += d.Nanoseconds()
			if err != nil {
				return err
			}
			return backend.Synchronize(ctx)
		})
		if err != nil {
			return err
		}
		if rit != nil {
			if hiddenInput {
				if err := r.verifyChain(ctx, it, rit, layer, hidden); err != nil {
					return err
				}
			} else {
				if err := rit.SetInputs(layer, fused, q); err != nil {
					return fmt.Errorf("reference engine: %w", err)
				}
				if ck != nil {
					if err := rit.SetCompressorInputs(layer, ck, cg); err != nil {
						return fmt.Errorf("reference engine: %w", err)
					}
				}
				if err := rit.RunLayer(ctx, layer); err != nil {
					return fmt.Errorf("reference engine: %w", err)
				}
			}
			if err := r.compare(it, rit, layer); err != nil {
				return err
			}
		}
		if r.dumpSelected(it.Index(), layer) {
			path, err := r.dump(it, s.Line, layer, s.Accepted())
			if err != nil {
				return err
			}
			ir.Dumps = append(ir.Dumps, path)
		}
	}
	if accepted := s.Accepted(); accepted != nil {
		if err := it.Accept(accepted); err != nil {
			return err
		}
		if rit != nil {
			if err := rit.Accept(accepted); err != nil {
				return fmt.Errorf("reference engine: %w", err)
			}
		}
	}
	if err := timed(func() error { return it.End(ctx) }); err != nil {
		return err
	}
	if rit != nil {
		if err := rit.End(ctx); err != nil {
			return fmt.Errorf("reference engine: %w", err)
		}
		ir.Verified = true
	}
	ir.Launches = it.Debug().Census()
	ir.WallNS = wall.Nanoseconds()
	r.log.Debug().Int("iteration", ir.Index).Int("line", s.Line).Int("ctx_tokens", ir.ContextTokens).
		Int("gen_tokens", ir.GenerationTokens).Dur("wall", wall).Msg("iteration")
	return nil
}

func (r *Replayer) dumpSelected(index, layer int) bool {
	if r.opts.DumpDir == "" {
		return false
	}
	return (r.opts.DumpIteration == nil || r.opts.DumpIteration(index)) &&
		(r.opts.DumpLayer == nil || r.opts.DumpLayer(layer))
}

// IterationReport is what one trace line did.
type IterationReport struct {
	Index            int  `json:"index"` // iteration number; -1 for a line that only finishes
	Line             int  `json:"line"`
	Batch            bool `json:"batch"`
	ContextSeqs      int  `json:"context_seqs"`
	ContextTokens    int  `json:"context_tokens"`
	GenerationSeqs   int  `json:"generation_seqs"`
	GenerationTokens int  `json:"generation_tokens"`
	// AcceptedTokens is what the iteration's sequences kept: every context
	// token, and per generation sequence its accepted count (the line's
	// accept list; without one all 1+MTP).
	AcceptedTokens int `json:"accepted_tokens"`
	// TopKSelected is the entries the indexer's top-k selected, over the
	// token rows and the ratio-4 layers (min(index_topk, visible) a row).
	TopKSelected int        `json:"topk_selected,omitempty"`
	MTP          int        `json:"mtp"`
	Rows         int        `json:"rows"` // token rows launched, padding included
	Launches     mla.Census `json:"launches"`
	// WallNS is the host time of Begin, each layer's launches and the wait
	// for them, and End; input synthesis, upload, verify and dump are
	// excluded.
	WallNS    int64    `json:"wall_ns"`
	DeviceNS  int64    `json:"device_ns,omitempty"` // device time of the layers' launches (EventTimer)
	HasDevice bool     `json:"has_device"`
	Finished  []uint64 `json:"finished,omitempty"`
	FreePages int      `json:"free_pages"`
	Verified  bool     `json:"verified"`
	Dumps     []string `json:"dumps,omitempty"`
}

// Kind names the iteration's batch shape: context, generation or mixed.
func (ir *IterationReport) Kind() string {
	switch {
	case !ir.Batch:
		return "finish"
	case ir.ContextTokens > 0 && ir.GenerationTokens > 0:
		return "mixed"
	case ir.ContextTokens > 0:
		return "context"
	}
	return "generation"
}

// Tokens is the iteration's real token count.
func (ir *IterationReport) Tokens() int { return ir.ContextTokens + ir.GenerationTokens }
