package mlatest_test

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// epsIgnoring is a backend with the defect the eps scenarios exist for: it
// normalizes with the default 1e-6 whatever LayerArgs.Eps says.
type epsIgnoring struct{ *cpu.Backend }

func (b epsIgnoring) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	c := *a
	c.Eps = numerics.DefaultEps
	return b.Backend.KVNormRopeStore(ctx, l, &c)
}

func (b epsIgnoring) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	c := *a
	c.Eps = numerics.DefaultEps
	return b.Backend.QNormRopeQuant(ctx, l, &c)
}

// TestSuiteCatchesIgnoredEps: every scenario with a non-default eps fails a
// backend that ignores it, in every configuration, and there are such
// scenarios of every phase.
func TestSuiteCatchesIgnoredEps(t *testing.T) {
	skipUnderRace(t)
	bad := epsIgnoring{cpu.New(0)}
	phases := map[string]bool{}
	for _, s := range mlatest.Scenarios() {
		if s.Eps == 0 || s.Eps == numerics.DefaultEps {
			continue
		}
		phases[strings.Split(s.Name, "/")[0]] = true
		for _, c := range mlatest.Configs() {
			seed := rand.Uint64()
			err := mlatest.Check(bad, s, c, seed)
			require.Error(t, err, "%s/%s seed %d: a backend ignoring Eps = %g passed", s.Name, c, seed, s.Eps)
			require.Contains(t, err.Error(), "differing bytes")
			require.NoError(t, mlatest.Check(cpu.New(0), s, c, seed), "%s/%s seed %d", s.Name, c, seed)
		}
	}
	require.Equal(t, map[string]bool{"context": true, "generation": true, "mixed": true}, phases)
}

// TestConfigsCoverFormats: the suite runs every cache format kvcache
// declares, with both Q formats.
func TestConfigsCoverFormats(t *testing.T) {
	seen := map[kvcache.Format]int{}
	for _, c := range mlatest.Configs() {
		seen[c.Format]++
	}
	require.Len(t, seen, len(kvcache.Formats()))
	for _, f := range kvcache.Formats() {
		require.Equal(t, 2, seen[f], "format %v", f)
	}
}

// TestRefusesBadEps: the layer arguments refuse an eps the kernels cannot
// use, before any launch.
func TestRefusesBadEps(t *testing.T) {
	for _, eps := range []float32{0, -1e-6, 1e-39, 0.5, float32(math.NaN()), float32(math.Inf(1))} {
		require.ErrorContains(t, mla.ValidateEps(eps), "mla: Eps (rms_norm_eps) = ")
	}
	for _, eps := range []float32{1e-5, 1e-6, 1e-12, mla.MaxEps} {
		require.NoError(t, mla.ValidateEps(eps))
	}
}
