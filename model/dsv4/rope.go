package dsv4

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
)

// RopeKind selects a layer's RoPE: plain with rope_theta, or YaRN with
// compress_rope_theta. The zero value is no kind, so that an unset field is
// caught.
type RopeKind uint8

const (
	RopePlain RopeKind = iota + 1 // compress_ratio 0 or 1: rope_theta, no scaling
	RopeYaRN                      // compress_ratio > 1: compress_rope_theta, YaRN, amplitude 1
)

func (k RopeKind) String() string {
	switch k {
	case RopePlain:
		return "plain"
	case RopeYaRN:
		return "yarn"
	}
	return fmt.Sprintf("RopeKind(%d)", uint8(k))
}

func (k RopeKind) valid() bool { return k == RopePlain || k == RopeYaRN }

// YaRNCorrectionRange is DeepSeek's find_correction_range: the first and
// last rotary dimensions of the YaRN ramp, for dim rotary values (pairs are
// dim/2). low is floor(d(betaFast)) raised to at least 0, high is
// ceil(d(betaSlow)) lowered to at most dim-1, where
// d(b) = dim*ln(originalMaxPositions/(b*2π)) / (2*ln(base)). Both are whole
// numbers, returned as float64 because out-of-range betas give ±Inf.
func YaRNCorrectionRange(betaFast, betaSlow float64, dim int, base float64, originalMaxPositions int) (low, high float64) {
	d := func(rotations float64) float64 {
		// Each step is rounded on its own (the conversions) so that no
		// architecture fuses them differently.
		ratio := float64(originalMaxPositions) / float64(rotations*2*math.Pi)
		return float64(float64(dim)*math.Log(ratio)) / float64(2*math.Log(base))
	}
	low = math.Max(math.Floor(d(betaFast)), 0)
	high = math.Min(math.Ceil(d(betaSlow)), float64(dim-1))
	return low, high
}

// yarnSmooth is 1 - DeepSeek's linear_ramp_factor(low, high, 32): 1 for
// pairs below low (kept at full frequency), 0 above high (divided by the
// factor), linear between.
func yarnSmooth(low, high float64) []float64 {
	if low == high {
		high += 0.001 // DeepSeek's guard against a zero-width ramp
	}
	s := make([]float64, ropePairs)
	for k := range s {
		ramp := float64(float64(k)-low) / float64(high-low)
		s[k] = 1 - math.Min(math.Max(ramp, 0), 1)
	}
	return s
}

// RopeFrequencies returns f_k for the 32 pairs, k = 0..31: base^(-2k/64) with
// base rope_theta (RopePlain) or compress_rope_theta (RopeYaRN); for YaRN,
// blended as f_k/factor*(1-smooth_k) + f_k*smooth_k.
func (c Config) RopeFrequencies(kind RopeKind) ([]float64, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.frequencies(kind)
}

func (c Config) frequencies(kind RopeKind) ([]float64, error) {
	var base float64
	var smooth []float64
	switch kind {
	case RopePlain:
		base = c.RopeTheta
	case RopeYaRN:
		base = c.CompressRopeTheta
		rs := c.RopeScaling
		smooth = yarnSmooth(YaRNCorrectionRange(rs.BetaFast, rs.BetaSlow, ropeDim, base, rs.OriginalMaxPositionEmbeddings))
	default:
		return nil, fmt.Errorf("dsv4: unknown RoPE kind %v", kind)
	}
	f := make([]float64, ropePairs)
	for k := range f {
		f[k] = math.Pow(base, -float64(2*k)/ropeDim)
		if smooth != nil {
			// Each product is rounded on its own: no fused multiply-add.
			s := smooth[k]
			scaled := float64(float64(f[k]/c.RopeScaling.Factor) * (1 - s))
			kept := float64(f[k] * s)
			f[k] = scaled + kept
		}
	}
	return f, nil
}

// RopeTable holds the (cos, sin) pairs of one RoPE kind for positions
// [0, Positions): CosSin[(pos*32+k)*2] is cos(pos*f_k) and the next value is
// sin(pos*f_k), each computed in float64 and rounded once to float32. This
// is the table every backend reads (DESIGN.md section 2).
type RopeTable struct {
	Kind      RopeKind
	Positions int
	CosSin    []float32 // [Positions][32 pairs][2]{cos, sin}
}

// rowFloats is the number of float32 values per position.
const rowFloats = 2 * ropePairs

// parallelRows is the least number of positions worth a goroutine.
const parallelRows = 4096

// NewRopeTable builds the table of one kind for positions [0, positions).
// positions must be in [1, MaxPositionEmbeddings]; a full 1,048,576-position
// table takes 256 MiB, so callers size it to what they serve.
func NewRopeTable(cfg Config, kind RopeKind, positions int) (*RopeTable, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !kind.valid() {
		return nil, fmt.Errorf("dsv4: unknown RoPE kind %v", kind)
	}
	if positions <= 0 || positions > cfg.MaxPositionEmbeddings || positions > math.MaxInt/rowFloats {
		return nil, fmt.Errorf("dsv4: RoPE table positions %d out of range [1, %d] (max_position_embeddings)",
			positions, cfg.MaxPositionEmbeddings)
	}
	freqs, err := cfg.frequencies(kind)
	if err != nil {
		return nil, err
	}
	t := &RopeTable{Kind: kind, Positions: positions, CosSin: make([]float32, positions*rowFloats)}

	// Positions are independent, so any split gives the same bytes.
	workers := min(runtime.GOMAXPROCS(0), (positions+parallelRows-1)/parallelRows)
	chunk := (positions + workers - 1) / workers
	var wg sync.WaitGroup
	for start := 0; start < positions; start += chunk {
		end := min(start+chunk, positions)
		wg.Go(func() { fillRope(t.CosSin, freqs, start, end) })
	}
	wg.Wait()
	return t, nil
}

func fillRope(dst []float32, freqs []float64, start, end int) {
	for pos := start; pos < end; pos++ {
		row := dst[pos*rowFloats : (pos+1)*rowFloats]
		p := float64(pos)
		for k, f := range freqs {
			angle := float64(p * f)
			row[2*k] = float32(math.Cos(angle))
			row[2*k+1] = float32(math.Sin(angle))
		}
	}
}

// CheckPosition returns an error naming pos when the table has no row for it.
func (t *RopeTable) CheckPosition(pos int) error {
	if pos < 0 || pos >= t.Positions {
		return fmt.Errorf("dsv4: position %d outside the %v RoPE table of %d positions", pos, t.Kind, t.Positions)
	}
	return nil
}

// At returns (cos, sin) of pair k at pos. It panics, like a slice index,
// when pos or k is out of range; validate positions with CheckPosition.
func (t *RopeTable) At(pos, k int) (c, s float32) {
	if pos < 0 || pos >= t.Positions || k < 0 || k >= ropePairs {
		panic(fmt.Sprintf("dsv4: RopeTable.At(%d, %d) outside [0, %d) x [0, %d)", pos, k, t.Positions, ropePairs))
	}
	i := (pos*ropePairs + k) * 2
	return t.CosSin[i], t.CosSin[i+1]
}

// Row returns the 64 values of pos, (cos, sin) for k = 0..31, sharing the
// table's memory. It panics when pos is out of range.
func (t *RopeTable) Row(pos int) []float32 {
	if pos < 0 || pos >= t.Positions {
		panic(fmt.Sprintf("dsv4: RopeTable.Row(%d) outside [0, %d)", pos, t.Positions))
	}
	return t.CosSin[pos*rowFloats : (pos+1)*rowFloats : (pos+1)*rowFloats]
}

// Bytes returns CosSin as little-endian float32s, the layout a GPU reads.
func (t *RopeTable) Bytes() []byte {
	b := make([]byte, 4*len(t.CosSin))
	for i, v := range t.CosSin {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// RopeTableSet holds one table per RoPE kind that some layer of a config
// uses, and picks the table of each layer.
type RopeTableSet struct {
	Plain *RopeTable // nil when no layer uses plain RoPE
	YaRN  *RopeTable // nil when no layer uses YaRN

	cfg Config // for LayerRope; CompressRatios is a private copy
}

// RopeTables builds, for positions [0, positions), each table some layer
// (MTP layers included) needs, once.
func (c Config) RopeTables(positions int) (*RopeTableSet, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c.CompressRatios = append([]int(nil), c.CompressRatios...)
	needPlain, needYaRN := false, false
	for _, r := range c.CompressRatios {
		if r > 1 {
			needYaRN = true
		} else {
			needPlain = true
		}
	}
	// MTP layers without a listed ratio are uncompressed (CompressRatio).
	if len(c.CompressRatios) < c.NumAttentionLayers() {
		needPlain = true
	}
	s := &RopeTableSet{cfg: c}
	var err error
	if needPlain {
		if s.Plain, err = NewRopeTable(c, RopePlain, positions); err != nil {
			return nil, err
		}
	}
	if needYaRN {
		if s.YaRN, err = NewRopeTable(c, RopeYaRN, positions); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Table returns the table of a kind, or an error when no layer uses it.
func (s *RopeTableSet) Table(kind RopeKind) (*RopeTable, error) {
	var t *RopeTable
	switch kind {
	case RopePlain:
		t = s.Plain
	case RopeYaRN:
		t = s.YaRN
	default:
		return nil, fmt.Errorf("dsv4: unknown RoPE kind %v", kind)
	}
	if t == nil {
		return nil, fmt.Errorf("dsv4: no layer uses %v RoPE, so its table was not built", kind)
	}
	return t, nil
}

// ForLayer returns the table a layer in [0, NumAttentionLayers()) reads.
func (s *RopeTableSet) ForLayer(layer int) (*RopeTable, error) {
	kind, err := s.cfg.LayerRope(layer)
	if err != nil {
		return nil, err
	}
	return s.Table(kind)
}
