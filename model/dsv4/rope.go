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

// RopeMode selects how the (cos, sin) table is computed (docs/DESIGN.md section
// 2). The zero value is RopeReference, the default.
type RopeMode uint8

const (
	// RopeReference computes the table in float32 as DeepSeek's reference
	// code (precompute_freqs_cis) and the serving engines do: f_k is the
	// float32 result of the reference's float32 operations, the angle is
	// theta = fl32(fl32(p) * f_k), and (cos, sin) of that float32 angle are
	// computed in float64 and rounded to float32. At position 327680 the
	// rounded angle moves cos/sin by up to 0.015 against exact math, so
	// this is the table a checkpoint was trained and is served with.
	RopeReference RopeMode = iota
	// RopeExact computes f_k, the angle and (cos, sin) in float64 and rounds
	// once to float32: the mathematically closest table.
	RopeExact
)

var ropeModeNames = [...]string{RopeReference: "reference", RopeExact: "exact"}

// RopeModes lists every mode, the default first.
func RopeModes() []RopeMode { return []RopeMode{RopeReference, RopeExact} }

// Valid reports whether m is one of the declared modes.
func (m RopeMode) Valid() bool { return int(m) < len(ropeModeNames) }

func (m RopeMode) String() string {
	if !m.Valid() {
		return fmt.Sprintf("RopeMode(%d)", uint8(m))
	}
	return ropeModeNames[m]
}

// ParseRopeMode returns the mode named s: "reference" or "exact".
func ParseRopeMode(s string) (RopeMode, error) {
	for m, name := range ropeModeNames {
		if s == name {
			return RopeMode(m), nil
		}
	}
	return 0, fmt.Errorf("dsv4: unknown RoPE mode %q (want reference or exact)", s)
}

// Set parses s into m, so that *RopeMode is a flag.Value.
func (m *RopeMode) Set(s string) error {
	p, err := ParseRopeMode(s)
	if err != nil {
		return err
	}
	*m = p
	return nil
}

// MarshalText implements encoding.TextMarshaler; an invalid mode is an error.
func (m RopeMode) MarshalText() ([]byte, error) {
	if !m.Valid() {
		return nil, fmt.Errorf("dsv4: cannot marshal invalid RoPE mode %d", uint8(m))
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *RopeMode) UnmarshalText(b []byte) error { return m.Set(string(b)) }

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

// RopeFrequencies returns f_k for the 32 pairs, k = 0..31, in float64 (the
// RopeExact frequencies): base^(-2k/64) with base rope_theta (RopePlain) or
// compress_rope_theta (RopeYaRN); for YaRN, blended as
// f_k/factor*(1-smooth_k) + f_k*smooth_k.
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

// RopeFrequencies32 returns the RopeReference frequencies: f_k as DeepSeek's
// reference computes it in float32 (precompute_freqs_cis), every operation
// rounded to float32:
//
//	e_k    = fl(fl(2k) / 64)                      arange(0, 64, 2) / dim
//	f_k    = fl(1 / fl(pow(fl(base), e_k)))       1.0 / (base ** e)
//	ramp_k = clamp(fl(fl(k - low) / fl(high - low)), 0, 1)
//	s_k    = fl(1 - ramp_k)                       smooth = 1 - ramp
//	f_k    = fl(fl(fl(f_k / fl(factor)) * fl(1 - s_k)) + fl(f_k * s_k))   YaRN only
//
// with low and high from YaRNCorrectionRange (whole numbers; DeepSeek adds
// 0.001 to high when they are equal, in float64, before the float32
// division). fl(pow) is the correctly rounded float32 power, which is what
// glibc's powf returns: it is computed here in float64 and rounded once
// (the float64 value is within a few float64 ulps of the true power, far
// closer than any float32 rounding boundary for these exponents; a test
// checks the margin for both published bases). The divisions are IEEE
// divisions, as torch on the CPU does them; torch on a GPU multiplies by the
// float32 reciprocal of a scalar divisor instead, which for V4's YaRN ramp
// (high - low = 10) changes ramp_24 = 0.9 by one float32 ulp.
func (c Config) RopeFrequencies32(kind RopeKind) ([]float32, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c.frequencies32(kind)
}

func (c Config) frequencies32(kind RopeKind) ([]float32, error) {
	var base float64
	yarn := false
	switch kind {
	case RopePlain:
		base = c.RopeTheta
	case RopeYaRN:
		base = c.CompressRopeTheta
		yarn = true
	default:
		return nil, fmt.Errorf("dsv4: unknown RoPE kind %v", kind)
	}
	b32 := float32(base)
	f := make([]float32, ropePairs)
	for k := range f {
		e := float32(float32(2*k) / ropeDim)
		pw := float32(math.Pow(float64(b32), float64(e)))
		f[k] = float32(1 / pw)
	}
	if !yarn {
		return f, nil
	}
	rs := c.RopeScaling
	low, high := YaRNCorrectionRange(rs.BetaFast, rs.BetaSlow, ropeDim, base, rs.OriginalMaxPositionEmbeddings)
	if low == high {
		high += 0.001
	}
	width := float32(high - low)
	factor := float32(rs.Factor)
	for k := range f {
		ramp := float32(float32(float32(k)-float32(low)) / width)
		ramp = min(max(ramp, 0), 1)
		smooth := float32(1 - ramp)
		scaled := float32(float32(f[k]/factor) * float32(1-smooth))
		kept := float32(f[k] * smooth)
		f[k] = float32(scaled + kept)
	}
	return f, nil
}

// RopeTable holds the (cos, sin) pairs of one RoPE kind for positions
// [0, Positions): CosSin[(pos*32+k)*2] is cos(pos*f_k) and the next value is
// sin(pos*f_k), computed as Mode says (RopeReference: of the float32 angle
// fl(fl(pos) * f_k) with the float32 f_k; RopeExact: all in float64), each
// rounded once to float32. This is the table every backend reads
// (docs/DESIGN.md section 2).
type RopeTable struct {
	Kind      RopeKind
	Mode      RopeMode
	Positions int
	CosSin    []float32 // [Positions][32 pairs][2]{cos, sin}
}

// rowFloats is the number of float32 values per position.
const rowFloats = 2 * ropePairs

// maxTablePositions bounds a table: positions are exact in float32 below
// 2^24 (the reference mode converts them), far past any model's
// max_position_embeddings.
const maxTablePositions = 1 << 24

// parallelRows is the least number of positions worth a goroutine.
const parallelRows = 4096

// NewRopeTable builds the table of one kind and mode for positions
// [0, positions). positions must be in [1, MaxPositionEmbeddings]; a full
// 1,048,576-position table takes 256 MiB, so callers size it to what they
// serve.
func NewRopeTable(cfg Config, kind RopeKind, mode RopeMode, positions int) (*RopeTable, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !kind.valid() {
		return nil, fmt.Errorf("dsv4: unknown RoPE kind %v", kind)
	}
	if !mode.Valid() {
		return nil, fmt.Errorf("dsv4: unknown RoPE mode %v", mode)
	}
	if positions > maxTablePositions && cfg.MaxPositionEmbeddings > maxTablePositions {
		return nil, fmt.Errorf("dsv4: RoPE table positions %d out of range [1, %d] (2^24: positions must be exact in float32)",
			positions, maxTablePositions)
	}
	if positions <= 0 || positions > cfg.MaxPositionEmbeddings {
		return nil, fmt.Errorf("dsv4: RoPE table positions %d out of range [1, %d] (max_position_embeddings)",
			positions, cfg.MaxPositionEmbeddings)
	}
	fill, err := cfg.filler(kind, mode)
	if err != nil {
		return nil, err
	}
	t := &RopeTable{Kind: kind, Mode: mode, Positions: positions, CosSin: make([]float32, positions*rowFloats)}

	// Positions are independent, so any split gives the same bytes.
	workers := min(runtime.GOMAXPROCS(0), (positions+parallelRows-1)/parallelRows)
	chunk := (positions + workers - 1) / workers
	var wg sync.WaitGroup
	for start := 0; start < positions; start += chunk {
		end := min(start+chunk, positions)
		wg.Go(func() { fill(t.CosSin[start*rowFloats:end*rowFloats], start, end) })
	}
	wg.Wait()
	return t, nil
}

// filler returns the function that writes the rows of positions
// [start, end) of a table of one kind and mode into dst (row 0 of dst is
// position start).
func (c Config) filler(kind RopeKind, mode RopeMode) (func(dst []float32, start, end int), error) {
	if mode == RopeExact {
		freqs, err := c.frequencies(kind)
		if err != nil {
			return nil, err
		}
		return func(dst []float32, start, end int) { fillExact(dst, freqs, start, end) }, nil
	}
	freqs, err := c.frequencies32(kind)
	if err != nil {
		return nil, err
	}
	return func(dst []float32, start, end int) { fillReference(dst, freqs, start, end) }, nil
}

func fillExact(dst []float32, freqs []float64, start, end int) {
	for pos := start; pos < end; pos++ {
		row := dst[(pos-start)*rowFloats : (pos-start+1)*rowFloats]
		p := float64(pos)
		for k, f := range freqs {
			angle := float64(p * f)
			row[2*k] = float32(math.Cos(angle))
			row[2*k+1] = float32(math.Sin(angle))
		}
	}
}

func fillReference(dst []float32, freqs []float32, start, end int) {
	for pos := start; pos < end; pos++ {
		row := dst[(pos-start)*rowFloats : (pos-start+1)*rowFloats]
		p := float32(pos) // exact: positions are below 2^24
		for k, f := range freqs {
			angle := float64(float32(p * f))
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
// uses, all of one mode, and picks the table of each layer.
type RopeTableSet struct {
	Plain *RopeTable // nil when no layer uses plain RoPE
	YaRN  *RopeTable // nil when no layer uses YaRN

	cfg Config // for LayerRope; CompressRatios is a private copy
}

// RopeTables builds, for positions [0, positions), each table some layer
// (MTP layers included) needs, once, in the given mode.
func (c Config) RopeTables(mode RopeMode, positions int) (*RopeTableSet, error) {
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
		if s.Plain, err = NewRopeTable(c, RopePlain, mode, positions); err != nil {
			return nil, err
		}
	}
	if needYaRN {
		if s.YaRN, err = NewRopeTable(c, RopeYaRN, mode, positions); err != nil {
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
