package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/numerics"
	"github.com/dsv4mla/prologue/weights"
)

// InputMode is where a layer starts (Config.Input).
type InputMode uint8

const (
	// InputHidden (the zero value): the engine starts from each layer's
	// hidden states (SetHidden or Engine.HiddenInput) and runs the whole
	// chain of DESIGN.md section 7 on the checkpoint's weights: act_quant,
	// the fused [wq_a; wkv] GEMM, q_norm with its act_quant, the wq_b GEMM,
	// then the prologue (the KV side on a second stream where the backend
	// has one).
	InputHidden InputMode = iota
	// InputProjected: the server runs the A and q_b projections itself and
	// hands the engine their outputs (SetInputs or Engine.Inputs); the
	// engine runs the prologue.
	InputProjected
)

func (m InputMode) String() string {
	switch m {
	case InputProjected:
		return "projected"
	case InputHidden:
		return "hidden"
	}
	return fmt.Sprintf("InputMode(%d)", uint8(m))
}

// ParseInputMode is the inverse of InputMode.String.
func ParseInputMode(s string) (InputMode, error) {
	switch strings.ToLower(s) {
	case "projected":
		return InputProjected, nil
	case "hidden":
		return InputHidden, nil
	}
	return 0, fmt.Errorf("engine: unknown input mode %q (want hidden or projected)", s)
}

// MarshalText implements encoding.TextMarshaler (flags, JSON).
func (m InputMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *InputMode) UnmarshalText(b []byte) error {
	v, err := ParseInputMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// resolveChain checks Input, Checkpoint and the head range, and fills in
// the head range's default (0, 0: all heads).
func (c Config) resolveChain() (Config, error) {
	h := c.Model.NumHeads
	if c.HeadBegin == 0 && c.HeadEnd == 0 {
		c.HeadEnd = h
	}
	if c.HeadBegin < 0 || c.HeadEnd > h || c.HeadBegin >= c.HeadEnd {
		field := "HeadEnd"
		if c.HeadBegin < 0 || c.HeadBegin >= h {
			field = "HeadBegin"
		}
		return c, fieldError(field, "HeadBegin, HeadEnd = %d, %d: want 0 <= HeadBegin < HeadEnd <= %d heads (0, 0 for all)",
			c.HeadBegin, c.HeadEnd, h)
	}
	switch c.Input {
	case InputProjected:
		if c.Checkpoint != "" {
			return c, fieldError("Checkpoint", "%q needs Config.Input = hidden (the projected path takes the projections' outputs, not weights)", c.Checkpoint)
		}
	case InputHidden:
		switch {
		case c.Checkpoint == "" && c.SyntheticWeights == nil:
			return c, &ConfigError{Field: "Checkpoint", Err: fmt.Errorf("empty with Config.Input = hidden: %w", ErrNoWeights)}
		case c.Checkpoint != "" && c.SyntheticWeights != nil:
			return c, fieldError("SyntheticWeights", "set with Config.Checkpoint = %q: the engine runs on one or the other", c.Checkpoint)
		}
		if c.Model.HiddenSize <= 0 || c.Model.HiddenSize%numerics.ActQuantBlockSize != 0 {
			return c, fmt.Errorf("engine: Config.Model hidden_size = %d: the chain quantizes hidden rows in blocks of %d, so it must be a positive multiple of %d",
				c.Model.HiddenSize, numerics.ActQuantBlockSize, numerics.ActQuantBlockSize)
		}
		if c.Model.QLoraRank%numerics.ActQuantBlockSize != 0 {
			return c, fmt.Errorf("engine: Config.Model q_lora_rank = %d: the chain quantizes q_norm's output in blocks of %d and fuses wq_a with wkv along 128-row weight blocks, so it must be a multiple of %d",
				c.Model.QLoraRank, numerics.ActQuantBlockSize, numerics.ActQuantBlockSize)
		}
	default:
		return c, fieldError("Input", "%v is unknown", c.Input)
	}
	return c, nil
}

// heads is the number of Q heads this engine computes, HeadEnd-HeadBegin
// (all heads before resolve fills in 0, 0).
func (c Config) heads() int {
	if c.HeadBegin == 0 && c.HeadEnd == 0 {
		return c.Model.NumHeads
	}
	return c.HeadEnd - c.HeadBegin
}

// chainState is what the hidden-state path adds to an engine: the
// fixed-address hidden input, the quantized activations between the steps
// and each layer's weights on the backend.
type chainState struct {
	cb     mla.ChainBackend
	forker mla.KVForker // nil: the KV prologue runs in order on the one stream
	// aux is the backend's third stream where its tuning puts the indexer's
	// query path there (mla.AuxRunner.AuxQuery) and it has the side
	// stream too; nil: the query path runs on the main stream.
	aux    mla.AuxRunner
	hidden mla.Buffer // [MaxTokens][hidden] bf16
	xq     mla.FP8Activations
	qn     mla.FP8Activations
	layers []chainLayer
	eps    float32
}

// chainLayer is one layer's chain weights on the backend.
type chainLayer struct {
	fused mla.FP8Weight // [wq_a; wkv]: q_lora_rank+512 rows of hidden
	wqB   mla.FP8Weight // the head range's rows of wq_b: heads*512 rows of q_lora_rank
	qNorm mla.Buffer    // q_norm weight, q_lora_rank float32
}

// newChain allocates the chain's buffers and uploads the weights. alloc
// registers every buffer with the engine so Close frees them.
func (e *Engine) newChain(alloc func(what string, n int, fill byte) (mla.Buffer, error)) error {
	cfg := e.cfg
	cb, ok := e.backend.(mla.ChainBackend)
	if !ok {
		return fmt.Errorf("engine: Config.Input = hidden: backend %s does not run the chain's steps (mla.ChainBackend: ActQuant, NormQuant, GEMM)", e.backend.Name())
	}
	c := &chainState{cb: cb, eps: float32(cfg.Model.RMSNormEps)}
	c.forker, _ = e.backend.(mla.KVForker)
	if a, ok := e.backend.(mla.AuxRunner); ok && c.forker != nil && a.AuxQuery() {
		if _, side := e.backend.(mla.SideRunner); side {
			c.aux = a
		}
	}
	T, H, Q := cfg.MaxTokens, cfg.Model.HiddenSize, cfg.Model.QLoraRank
	var err error
	if c.hidden, err = alloc("hidden-state input", T*H*2, 0); err != nil {
		return err
	}
	acts := func(what string, k int) (mla.FP8Activations, error) {
		a := mla.FP8Activations{Rows: T, K: k, ScaleStride: T} // Rows and ScaleStride are set per run
		var err error
		if a.Data, err = alloc(what+" e4m3", T*k, 0); err != nil {
			return a, err
		}
		a.Scale, err = alloc(what+" scales", k/numerics.ActQuantBlockSize*T*4, 0)
		return a, err
	}
	if c.xq, err = acts("quantized hidden states", H); err != nil {
		return err
	}
	if c.qn, err = acts("q_norm output", Q); err != nil {
		return err
	}
	src, err := openWeightSource(cfg)
	if err != nil {
		return err
	}
	defer src.Close()
	for l := range cfg.Layers {
		w, err := src.Layer(l)
		if err != nil {
			return err
		}
		if cfg.Compresses() && w.Compressor != nil {
			if e.compWeights == nil {
				e.compWeights = map[int]*weights.Compressor{}
			}
			e.compWeights[l] = w.Compressor
		}
		if cfg.indexerRunning() && w.Indexer != nil {
			if e.idxWeights == nil {
				e.idxWeights = map[int]*weights.IndexerWeights{}
			}
			e.idxWeights[l] = w.Indexer
		}
		cl, err := e.uploadLayer(l, w, alloc)
		if err != nil {
			return err
		}
		c.layers = append(c.layers, cl)
	}
	e.chain = c
	return nil
}

// HiddenInput returns the hidden-state input buffer, [MaxTokens][hidden]
// bf16 row-major, for producers that write it on the device (Config.Input
// = hidden): row t is token row t of the iteration; RunLayer reads the
// first Rows() rows (rows past Tokens() are graph padding: any values).
// It is nil on the projected path.
func (e *Engine) HiddenInput() mla.Buffer {
	if e.chain == nil {
		return nil
	}
	return e.chain.hidden
}

// HiddenSize is the width of a hidden-state row.
func (e *Engine) HiddenSize() int { return e.cfg.Model.HiddenSize }

// SetHidden copies one layer's hidden states into the hidden-state input:
// rows holds Tokens() rows of hidden_size bf16 (little-endian). It first
// waits for the launches already issued, which read the same buffer.
// RunLayer must then run the same layer: a mismatch is refused.
//
// Producers that write the hidden states on the device use HiddenInput.
func (it *Iteration) SetHidden(layer int, rows []byte) error {
	if err := it.check(layer); err != nil {
		return err
	}
	e := it.e
	if e.chain == nil {
		return fmt.Errorf("engine: SetHidden(layer %d): Config.Input is %v; the hidden-state input needs Config.Input = hidden", layer, e.cfg.Input)
	}
	if want := it.meta.Tokens * e.cfg.Model.HiddenSize * 2; len(rows) != want {
		return fmt.Errorf("engine: SetHidden(layer %d): rows has %d bytes, %d tokens of %d bf16 need %d",
			layer, len(rows), it.meta.Tokens, e.cfg.Model.HiddenSize, want)
	}
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return fmt.Errorf("engine: SetHidden(layer %d): waiting for earlier launches: %w", layer, err)
	}
	if err := e.backend.Write(e.chain.hidden, 0, rows); err != nil {
		return fmt.Errorf("engine: SetHidden(layer %d): %w", layer, err)
	}
	it.inputsFor = layer
	return nil
}

// Stage is one step of the chain, for verification and tests that run the
// steps one at a time (IterationDebug.RunStage).
type Stage uint8

const (
	// StageActQuant quantizes the hidden rows (act_quant).
	StageActQuant Stage = iota
	// StageFusedGEMM writes the fused A rows: [q | latent] = xq . [wq_a; wkv]^T.
	StageFusedGEMM
	// StageQNorm normalizes the q part of the fused rows and quantizes it.
	StageQNorm
	// StageQGEMM writes the Q input rows: xq_norm . wq_b^T (the head range's rows).
	StageQGEMM
	// StagePrologue runs the KV and Q prologue on the fused rows' latent and
	// the Q input rows, then a compressed layer's compressor step on the
	// projections of StageCompressorGEMM; the layer counts as run.
	StagePrologue
	// StageCompressorGEMM writes a compressed layer's compressor projections
	// (TensorCompressorKG) from the hidden rows, in a ratio-4 layer with the
	// indexer with the indexer's bf16 projections of the same rows
	// (TensorIndexerKG, TensorIndexerWeightsProj) in the same GEMM; nothing
	// for other layers. RunLayer runs it on the side stream, under the
	// other GEMMs.
	StageCompressorGEMM
	// StageIndexerGEMMs writes a ratio-4 layer's indexer wq_b GEMM output
	// (TensorIndexerQIn, from q_norm's activation, so after StageQNorm);
	// nothing for a layer without the indexer. StagePrologue then runs the
	// indexer's steps.
	StageIndexerGEMMs
)

func (s Stage) String() string {
	switch s {
	case StageActQuant:
		return "act_quant"
	case StageFusedGEMM:
		return "fused A GEMM"
	case StageQNorm:
		return "q_norm"
	case StageQGEMM:
		return "wq_b GEMM"
	case StagePrologue:
		return "prologue"
	case StageCompressorGEMM:
		return "compressor GEMM"
	case StageIndexerGEMMs:
		return "indexer GEMMs"
	}
	return fmt.Sprintf("Stage(%d)", uint8(s))
}

// The arguments of the steps before the prologue, over rows rows. The
// scales of the quantized activations are laid out [K/128][rows]: the
// buffers hold MaxTokens rows, but an unpadded stride is what cuBLASLt's
// block-scale mode takes, and a graph captures one row count anyway.
func (e *Engine) actQuantArgs(rows int) *mla.ActQuantArgs {
	out := e.chain.xq
	out.Rows = rows
	out.ScaleStride = rows
	return &mla.ActQuantArgs{X: e.chain.hidden, XStride: e.cfg.Model.HiddenSize, Out: out}
}

func (e *Engine) fusedGEMMArgs(layer, rows int) *mla.GEMMArgs {
	x := e.chain.xq
	x.Rows = rows
	x.ScaleStride = rows
	return &mla.GEMMArgs{X: x, W: &e.chain.layers[layer].fused, Y: e.fusedA, YStride: e.cfg.fusedRowElems()}
}

func (e *Engine) qNormArgs(layer, rows int) *mla.NormQuantArgs {
	out := e.chain.qn
	out.Rows = rows
	out.ScaleStride = rows
	return &mla.NormQuantArgs{X: e.fusedA, XStride: e.cfg.fusedRowElems(), Weight: e.chain.layers[layer].qNorm,
		Eps: e.chain.eps, Out: out}
}

func (e *Engine) qGEMMArgs(layer, rows int) *mla.GEMMArgs {
	x := e.chain.qn
	x.Rows = rows
	x.ScaleStride = rows
	return &mla.GEMMArgs{X: x, W: &e.chain.layers[layer].wqB, Y: e.qIn, YStride: e.cfg.heads() * numerics.HeadDim}
}

// runStage issues one step over rows rows (the iteration's padded rows).
func (e *Engine) runStage(ctx context.Context, s Stage, layer int, launches []mla.Launch) error {
	rows := launchRows(launches)
	c := e.chain
	var err error
	switch s {
	case StageActQuant:
		err = c.cb.ActQuant(ctx, e.actQuantArgs(rows))
	case StageFusedGEMM:
		err = c.cb.GEMM(ctx, e.fusedGEMMArgs(layer, rows))
	case StageQNorm:
		err = c.cb.NormQuant(ctx, e.qNormArgs(layer, rows))
	case StageQGEMM:
		err = c.cb.GEMM(ctx, e.qGEMMArgs(layer, rows))
	case StagePrologue:
		err = mla.RunLayer(ctx, e.backend, launches, e.args[layer])
	case StageCompressorGEMM:
		if e.comp != nil {
			err = e.compressProject(ctx, layer, rows)
		}
	case StageIndexerGEMMs:
		err = e.indexerQueryGEMM(ctx, layer, rows)
	default:
		err = fmt.Errorf("unknown stage %v", s)
	}
	if err != nil {
		return fmt.Errorf("%v: %w", s, err)
	}
	return nil
}

// launchRows is the token rows the launches cover, padding included.
func launchRows(ls []mla.Launch) int {
	last := ls[len(ls)-1]
	return last.RowBegin + last.Rows
}

// runChain issues a whole layer from the hidden states: a compressed
// layer's compressor on the side stream (its one bf16 projection GEMM,
// with the indexer's projections in a ratio-4 layer, and the steps), act_quant and the
// fused GEMM, then the KV prologue on the side stream (forked) while
// q_norm, the wq_b GEMM, the Q prologue and the indexer's wq_b GEMM run on
// the main stream, the join, and the indexer's query step and selection.
// Where the backend puts the indexer's query path on its third stream
// (chainState.aux), its wq_b GEMM and query step run there instead, forked
// after q_norm, the step after the side stream's projection GEMM (marked
// by compressLayer), joined with the side stream.
// On a backend without a second stream the compressor runs first and the
// KV prologue in order after the fused GEMM.
func (e *Engine) runChain(ctx context.Context, layer int, launches []mla.Launch) error {
	a := e.args[layer]
	if err := a.Validate(launchRows(launches)); err != nil {
		return err
	}
	c := e.chain
	rows := launchRows(launches)
	auxQ := e.indexerOnAux(layer)
	// The compressor first, on the side stream: it reads only the hidden
	// rows, so it runs under the layer's GEMMs.
	compSide, err := e.compressLayer(ctx, layer, rows)
	if err != nil {
		if compSide {
			err = errors.Join(err, c.forker.JoinKV(ctx))
		}
		return err
	}
	for _, s := range []Stage{StageActQuant, StageFusedGEMM} {
		if err := e.runStage(ctx, s, layer, launches); err != nil {
			if compSide {
				err = errors.Join(err, c.forker.JoinKV(ctx))
			}
			return err
		}
	}
	if c.forker == nil {
		if err := mla.KVOnly(ctx, e.backend, launches, a); err != nil {
			return err
		}
	} else if err := c.forker.ForkKV(ctx, launches, a); err != nil {
		return fmt.Errorf("forking the KV prologue: %w", err)
	}
	err = func() error {
		if err := e.runStage(ctx, StageQNorm, layer, launches); err != nil {
			return err
		}
		if auxQ {
			if err := c.aux.Aux(ctx, func() error {
				if err := e.indexerQueryGEMM(ctx, layer, rows); err != nil {
					return err
				}
				// weights_proj's columns of the side stream's projection GEMM.
				if err := c.aux.AwaitSide(ctx); err != nil {
					return fmt.Errorf("indexer query: %w", err)
				}
				return e.indexerQuery(ctx, layer, launches)
			}); err != nil {
				return err
			}
		}
		if err := e.runStage(ctx, StageQGEMM, layer, launches); err != nil {
			return err
		}
		if err := mla.QOnly(ctx, e.backend, launches, a); err != nil {
			return err
		}
		if auxQ {
			return nil
		}
		return e.indexerQueryGEMM(ctx, layer, rows)
	}()
	if c.forker != nil {
		// Join even after a failure: a graph capture must end joined, and
		// the buffers the side stream reads must not be rewritten under it.
		if jerr := c.forker.JoinKV(ctx); jerr != nil {
			err = errors.Join(err, fmt.Errorf("joining the KV prologue: %w", jerr))
		}
	}
	if err != nil {
		return err
	}
	// The query step after the join: it reads weights_proj's columns of the
	// side stream's projection GEMM (the main stream is the longer one at
	// decode, so the join costs it nothing there). The selection last: it
	// reads the query and the entries the side stream's indexer key step
	// wrote this iteration.
	if !auxQ {
		if err := e.indexerQuery(ctx, layer, launches); err != nil {
			return err
		}
	}
	return e.indexerTopK(ctx, layer, rows)
}

// RunStage issues one step of the chain of a layer (Config.Input = hidden),
// in order on the main stream: the steps RunLayer runs, one at a time, so
// a verifier can read or replace a step's output (ReadChain, WriteChain)
// before the next. The layer counts as run once StagePrologue ran.
func (d IterationDebug) RunStage(ctx context.Context, layer int, s Stage) error {
	it := d.it
	if err := it.check(layer); err != nil {
		return err
	}
	e := it.e
	if e.chain == nil {
		return fmt.Errorf("engine: RunStage(%d, %v): Config.Input is %v; stages need Config.Input = hidden", layer, s, e.cfg.Input)
	}
	if it.inputsFor >= 0 && it.inputsFor != layer {
		return fmt.Errorf("engine: RunStage(%d, %v): the input buffers hold layer %d's inputs", layer, s, it.inputsFor)
	}
	if err := e.runStage(ctx, s, layer, it.launches); err != nil {
		it.fail(err)
		return fmt.Errorf("engine: RunStage(%d): %w", layer, err)
	}
	switch s {
	case StageCompressorGEMM:
		if it.comp != nil {
			it.comp.projected = layer
		}
	case StageIndexerGEMMs:
		it.idxProjected = layer
	case StagePrologue:
		if e.comp != nil && e.comp.layers[layer] != nil {
			if it.comp.projected != layer {
				err := fmt.Errorf("engine: RunStage(%d, %v): layer %d is a ratio-%d layer: run %v first", layer, s, layer, e.comp.layers[layer].ratio, StageCompressorGEMM)
				it.fail(err)
				return err
			}
			if err := e.compressStep(ctx, layer); err != nil {
				it.fail(err)
				return fmt.Errorf("engine: RunStage(%d): compressor step: %w", layer, err)
			}
			if e.idx != nil && e.idx.layers[layer] != nil && it.idxProjected != layer {
				err := fmt.Errorf("engine: RunStage(%d, %v): layer %d has the indexer: run %v first", layer, s, layer, StageIndexerGEMMs)
				it.fail(err)
				return err
			}
			if err := e.indexerKeys(ctx, layer); err != nil {
				it.fail(err)
				return fmt.Errorf("engine: RunStage(%d): %w", layer, err)
			}
			if err := e.indexerQuery(ctx, layer, it.launches); err != nil {
				it.fail(err)
				return fmt.Errorf("engine: RunStage(%d): %w", layer, err)
			}
			if err := e.indexerTopK(ctx, layer, launchRows(it.launches)); err != nil {
				it.fail(err)
				return fmt.Errorf("engine: RunStage(%d): %w", layer, err)
			}
		}
		it.markRan(layer)
	}
	return nil
}

// ChainTensor names a buffer of the chain (IterationDebug.ReadChain).
type ChainTensor uint8

const (
	// TensorHidden is the hidden-state input, [Tokens][hidden] bf16.
	TensorHidden ChainTensor = iota
	// TensorHiddenFP8 is act_quant's output, [Tokens][hidden] e4m3.
	TensorHiddenFP8
	// TensorHiddenScale is act_quant's scales, [hidden/128][Tokens] float32
	// (each 128-block's scales of all rows contiguous, as the GEMM reads them).
	TensorHiddenScale
	// TensorFusedA is the fused GEMM's output, [Tokens][q_lora_rank+512]
	// bf16: q_lora_rank values for q_norm, then the KV latent.
	TensorFusedA
	// TensorQNormFP8 is q_norm's quantized output, [Tokens][q_lora_rank] e4m3.
	TensorQNormFP8
	// TensorQNormScale is its scales, [q_lora_rank/128][Tokens] float32.
	TensorQNormScale
	// TensorQIn is the wq_b GEMM's output (the Q prologue's input),
	// [Tokens][heads][512] bf16 for the engine's head range.
	TensorQIn
	// TensorCompressorKG is a compressed layer's projections (the compressor
	// GEMM's output), [Tokens][2*Width] float32: K then G without ape.
	TensorCompressorKG
	// TensorIndexerQIn is the indexer's wq_b GEMM output, [Tokens][64][128]
	// bf16 (the query step's input).
	TensorIndexerQIn
	// TensorIndexerWeightsProj is weights_proj's output, [Tokens][64]
	// float32 (unrounded: the query step rounds it to bf16).
	TensorIndexerWeightsProj
	// TensorIndexerKG is the indexer compressor's projections,
	// [Tokens][2*256] float32: K then G without ape.
	//
	// TensorCompressorKG, TensorIndexerKG and TensorIndexerWeightsProj of a
	// ratio-4 layer with the indexer are columns of one GEMM's output rows
	// (StageCompressorGEMM); ReadChain and WriteChain take each packed as
	// described, the layer's last projected (RunLayer or
	// StageCompressorGEMM) for ReadChain.
	TensorIndexerKG
)

func (t ChainTensor) String() string {
	switch t {
	case TensorHidden:
		return "hidden"
	case TensorHiddenFP8:
		return "hidden_fp8"
	case TensorHiddenScale:
		return "hidden_scale"
	case TensorFusedA:
		return "fused_a"
	case TensorQNormFP8:
		return "q_norm_fp8"
	case TensorQNormScale:
		return "q_norm_scale"
	case TensorQIn:
		return "q_in"
	case TensorCompressorKG:
		return "compressor_kg"
	case TensorIndexerQIn:
		return "indexer_q_in"
	case TensorIndexerWeightsProj:
		return "indexer_weights_proj"
	case TensorIndexerKG:
		return "indexer_kg"
	}
	return fmt.Sprintf("ChainTensor(%d)", uint8(t))
}

// ReadChain returns the real rows (Tokens()) of a chain buffer, after the
// work issued so far. The scale tensors come back as [K/128][Tokens()].
func (d IterationDebug) ReadChain(t ChainTensor) ([]byte, error) {
	it := d.it
	e := it.e
	T := it.meta.Tokens
	if t == TensorFusedA || t == TensorQIn {
		n := T * e.cfg.fusedRowElems() * 2
		buf := e.fusedA
		if t == TensorQIn {
			n, buf = T*e.cfg.heads()*numerics.HeadDim*2, e.qIn
		}
		return it.read(t, buf, 0, n)
	}
	if e.chain == nil {
		return nil, fmt.Errorf("engine: ReadChain(%v): Config.Input is %v; the chain's buffers need Config.Input = hidden", t, e.cfg.Input)
	}
	c := e.chain
	switch t {
	case TensorIndexerQIn:
		if e.idx == nil {
			return nil, fmt.Errorf("engine: ReadChain(%v): the indexer's compute is off", t)
		}
		return it.read(t, e.idx.qIn, 0, T*mla.IndexerHeads*mla.IndexerDim*2)
	case TensorCompressorKG, TensorIndexerKG, TensorIndexerWeightsProj:
		if it.comp == nil || it.comp.projected < 0 {
			return nil, fmt.Errorf("engine: ReadChain(%v): no compressor projection ran in this iteration (%v)", t, StageCompressorGEMM)
		}
		rows, col, n, stride, err := it.readProjection(t, it.comp.projected)
		if err != nil {
			return nil, err
		}
		out := make([]byte, 0, T*n*4)
		for r := range T {
			out = append(out, rows[(r*stride+col)*4:(r*stride+col+n)*4]...)
		}
		return out, nil
	case TensorHidden:
		return it.read(t, c.hidden, 0, T*e.cfg.Model.HiddenSize*2)
	case TensorHiddenFP8:
		return it.read(t, c.xq.Data, 0, T*c.xq.K)
	case TensorQNormFP8:
		return it.read(t, c.qn.Data, 0, T*c.qn.K)
	case TensorHiddenScale, TensorQNormScale:
		a := c.xq
		if t == TensorQNormScale {
			a = c.qn
		}
		blocks := a.K / numerics.ActQuantBlockSize
		out := make([]byte, 0, blocks*T*4)
		for b := range blocks {
			row, err := it.read(t, a.Scale, b*it.meta.PaddedTokens*4, T*4) // the stride of the last run: its rows
			if err != nil {
				return nil, err
			}
			out = append(out, row...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("engine: ReadChain: unknown tensor %v", t)
}

// readProjection reads the real rows of layer's projection rows and where
// t's columns lie in them.
func (it *Iteration) readProjection(t ChainTensor, layer int) (rows []byte, col, n, stride int, err error) {
	if col, n, stride, err = it.e.projColumns(t, layer); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("engine: %v: %w", t, err)
	}
	rows, err = it.read(t, it.e.comp.kg, 0, it.meta.Tokens*stride*4)
	return rows, col, n, stride, err
}

func (it *Iteration) read(t ChainTensor, buf mla.Buffer, off, n int) ([]byte, error) {
	e := it.e
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return nil, err
	}
	out := make([]byte, n)
	if err := e.backend.Read(out, buf, off); err != nil {
		return nil, fmt.Errorf("engine: reading %v: %w", t, err)
	}
	return out, nil
}

// WriteChain replaces the real rows of a GEMM output (TensorFusedA,
// TensorQIn, and a compressed or ratio-4 layer's projections and indexer
// wq_b output) of a layer, for a verifier that feeds the next steps another
// backend's GEMM output. The layer's next stage must follow.
func (d IterationDebug) WriteChain(layer int, t ChainTensor, rows []byte) error {
	it := d.it
	if err := it.check(layer); err != nil {
		return err
	}
	e := it.e
	var buf mla.Buffer
	want := 0
	switch t {
	case TensorFusedA:
		buf, want = e.fusedA, it.meta.Tokens*e.cfg.fusedRowElems()*2
	case TensorQIn:
		buf, want = e.qIn, it.meta.Tokens*e.cfg.heads()*numerics.HeadDim*2
	case TensorCompressorKG, TensorIndexerWeightsProj, TensorIndexerKG:
		if e.chain == nil {
			return fmt.Errorf("engine: WriteChain(layer %d, %v): Config.Input is %v; the projections need Config.Input = hidden", layer, t, e.cfg.Input)
		}
		_, n, _, err := e.projColumns(t, layer)
		if err != nil {
			return fmt.Errorf("engine: WriteChain(layer %d, %v): %w", layer, t, err)
		}
		buf, want = e.comp.kg, it.meta.Tokens*n*4
	case TensorIndexerQIn:
		if e.idx == nil || e.idx.layers[layer] == nil {
			return fmt.Errorf("engine: WriteChain(layer %d, %v): the layer runs no indexer", layer, t)
		}
		buf, want = e.idx.qIn, it.meta.Tokens*mla.IndexerHeads*mla.IndexerDim*2
	default:
		return fmt.Errorf("engine: WriteChain(%v): only the GEMM outputs (%v, %v, %v, %v, %v, %v) can be written", t,
			TensorFusedA, TensorQIn, TensorCompressorKG, TensorIndexerQIn, TensorIndexerWeightsProj, TensorIndexerKG)
	}
	if len(rows) != want {
		return fmt.Errorf("engine: WriteChain(layer %d, %v): %d bytes, %d tokens need %d", layer, t, len(rows), it.meta.Tokens, want)
	}
	if it.inputsFor >= 0 && it.inputsFor != layer {
		return fmt.Errorf("engine: WriteChain(layer %d, %v): the input buffers hold layer %d's inputs", layer, t, it.inputsFor)
	}
	if buf == e.kgBuffer() {
		// A column slice of the projection rows: the other columns stay.
		all, col, n, stride, err := it.readProjection(t, layer)
		if err != nil {
			return err
		}
		for r := range it.meta.Tokens {
			copy(all[(r*stride+col)*4:(r*stride+col+n)*4], rows[r*n*4:(r+1)*n*4])
		}
		rows = all
	}
	if err := e.backend.Synchronize(context.Background()); err != nil {
		return err
	}
	if err := e.backend.Write(buf, 0, rows); err != nil {
		return fmt.Errorf("engine: WriteChain(layer %d, %v): %w", layer, t, err)
	}
	it.inputsFor = layer
	return nil
}

// kgBuffer is the projection rows' buffer, nil without the compressor.
func (e *Engine) kgBuffer() mla.Buffer {
	if e.comp == nil {
		return nil
	}
	return e.comp.kg
}

// ChainWeights returns host copies of a layer's GEMM weights as the backend
// holds them (Config.Input = hidden): the fused [wq_a; wkv] matrix and the
// head range's rows of wq_b. A verifier uses them to bound another
// backend's GEMM outputs (package gemm).
func (d Debug) ChainWeights(layer int) (fusedA, wqB weights.FP8Matrix, err error) {
	e := d.e
	if err := e.checkLayer(layer); err != nil {
		return fusedA, wqB, err
	}
	if e.chain == nil {
		return fusedA, wqB, fmt.Errorf("engine: ChainWeights(%d): Config.Input is %v; weights need Config.Input = hidden", layer, e.cfg.Input)
	}
	read := func(w *mla.FP8Weight) (weights.FP8Matrix, error) {
		m := weights.FP8Matrix{N: w.N, K: w.K, Data: make([]byte, w.N*w.K)}
		if err := e.backend.Read(m.Data, w.Data, 0); err != nil {
			return m, fmt.Errorf("engine: reading layer %d weights: %w", layer, err)
		}
		raw := make([]byte, 4*m.ScaleRows()*m.ScaleCols())
		if err := e.backend.Read(raw, w.Scale, 0); err != nil {
			return m, fmt.Errorf("engine: reading layer %d weight scales: %w", layer, err)
		}
		m.Scale = make([]float32, len(raw)/4)
		for i := range m.Scale {
			m.Scale[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		return m, nil
	}
	l := &e.chain.layers[layer]
	if fusedA, err = read(&l.fused); err != nil {
		return fusedA, wqB, err
	}
	wqB, err = read(&l.wqB)
	return fusedA, wqB, err
}
