package metadata

import (
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
)

// fl24 rounds x to float32 precision, ties to even: an implementation of fl()
// independent of the hardware float32 unit. Inputs stay in the normal range,
// where 24-bit big.Float rounding is exactly IEEE float32 rounding.
func fl24(x *big.Float) *big.Float {
	return new(big.Float).SetPrec(24).SetMode(big.ToNearestEven).Set(x)
}

func bigOf(f float32) *big.Float { return new(big.Float).SetFloat64(float64(f)) }

// referenceScalars evaluates the contract with big.Float.
func referenceScalars(p SchedulerParams) (bmm10, bmm11, bmm2 float32) {
	sqrt512 := fl24(new(big.Float).SetPrec(200).Sqrt(new(big.Float).SetPrec(200).SetInt64(512)))
	log2e, _, err := big.ParseFloat("1.442695040888963407359924681001892137426645954152985934135449406931", 10, 200, big.ToNearestEven)
	if err != nil {
		panic(err)
	}
	log2e = fl24(log2e)
	mul := func(a, b *big.Float) *big.Float { return fl24(new(big.Float).SetPrec(200).Mul(a, b)) }
	quo := func(a, b *big.Float) *big.Float { return fl24(new(big.Float).SetPrec(200).Quo(a, b)) }
	denom := mul(bigOf(p.QScaling), sqrt512)
	b0 := quo(mul(bigOf(p.QDeq), bigOf(p.KVDeq)), denom)
	b1 := mul(b0, log2e)
	b2 := mul(bigOf(p.OScale), bigOf(p.KVDeq))
	f := func(x *big.Float) float32 { v, _ := x.Float32(); return v }
	return f(b0), f(b1), f(b2)
}

func TestSchedulerScalarsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(testSeed(t), 0x7363686564))
	randScale := func() float32 { // normal float32 in [2^-20, 2^20)
		return float32(math.Ldexp(1+rng.Float64(), rng.IntN(40)-20))
	}
	cases := []SchedulerParams{
		DefaultSchedulerParams(),
		{QDeq: 0.5, KVDeq: 2, QScaling: 1.25, OScale: 3},
		{QDeq: 1.0 / 448, KVDeq: 1.0 / 448, QScaling: 1, OScale: 1},
	}
	for range 5000 {
		cases = append(cases, SchedulerParams{QDeq: randScale(), KVDeq: randScale(), QScaling: randScale(), OScale: randScale()})
	}
	for _, p := range cases {
		got := ComputeSchedulerScalars(p)
		b0, b1, b2 := referenceScalars(p)
		if got.TileCounter != 0 ||
			math.Float32bits(got.BMM1[0]) != math.Float32bits(b0) ||
			math.Float32bits(got.BMM1[1]) != math.Float32bits(b1) ||
			math.Float32bits(got.BMM2) != math.Float32bits(b2) {
			t.Fatalf("%+v: got %+v, reference bmm1 [%v %v] bmm2 %v", p, got, b0, b1, b2)
		}
	}
}

// A real-valued formula evaluated once in float64 differs from the
// step-by-step float32 contract in the last bit for some inputs; the contract
// is the float32 order. This pins that the difference stays within rounding.
func TestSchedulerScalarsCloseToRealFormula(t *testing.T) {
	p := SchedulerParams{QDeq: 0.75, KVDeq: 1.5, QScaling: 0.9, OScale: 2.5}
	got := ComputeSchedulerScalars(p)
	exact := 0.75 * 1.5 / (0.9 * math.Sqrt(512))
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"bmm1[0]", float64(got.BMM1[0]), exact},
		{"bmm1[1]", float64(got.BMM1[1]), exact * math.Log2E},
		{"bmm2", float64(got.BMM2), 2.5 * 1.5},
	} {
		if rel := math.Abs(c.got-c.want) / c.want; rel > 4e-7 {
			t.Errorf("%s = %v, real value %v (relative error %g)", c.name, c.got, c.want, rel)
		}
	}
}
