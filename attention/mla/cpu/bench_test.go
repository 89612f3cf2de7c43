package cpu_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
)

// flashLayer builds one V4-Flash layer's arguments for a context batch of
// rows tokens in one sequence.
func flashLayer(b *testing.B, be mla.Backend, rows int, format kvcache.Format) (*mla.LayerArgs, []mla.Launch) {
	const heads, qLora = 64, 1024
	plan, err := metadata.NewPlan([]metadata.Request{{Seq: 1, Phase: metadata.Context, NewTokens: rows}},
		func(uint64) (int, bool, error) { return 0, false, nil },
		metadata.Params{Heads: heads, PageSize: 64, MaxPositions: rows, Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		b.Fatal(err)
	}
	pages := (rows + 63) / 64
	table := make([]int32, pages)
	for i := range table {
		table[i] = int32(i)
	}
	m, err := plan.Build(func(uint64) ([]int32, error) { return table, nil })
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) mla.Buffer {
		buf, _ := be.Alloc(n)
		p := cpu.Bytes(buf)
		for i := 0; i+1 < n; i += 2 {
			binary.LittleEndian.PutUint16(p[i:], uint16(math.Float32bits(float32(r.NormFloat64()))>>16))
		}
		return buf
	}
	a := &mla.LayerArgs{
		Heads: heads, LatentOffset: qLora * 2, LatentStride: qLora + 512,
		Latent: fill(rows * (qLora + 512) * 2), QIn: fill(rows * heads * 1024),
		KVWeight: fill(2048), Rope: fill(rows * 256), RopePositions: rows,
		CacheConfig: kvcache.Config{Format: format, PageSize: 64, NumPages: pages, KVScale: 1},
		QScale:      1, Scheduler: metadata.DefaultSchedulerParams(),
	}
	a.QOut, _ = be.Alloc(rows * heads * 512)
	a.Cache, _ = be.Alloc(a.CacheConfig.PoolBytes())
	if a.Meta, err = mla.NewMetadataBuffers(be, 1, pages); err != nil {
		b.Fatal(err)
	}
	if err := a.Meta.Upload(be, m, pages); err != nil {
		b.Fatal(err)
	}
	return a, mla.Plan(m)
}

// BenchmarkKV reports latent rows per second at V4-Flash dims on every core.
func BenchmarkKV(b *testing.B) {
	be := cpu.New(0)
	const rows = 4096
	a, ls := flashLayer(b, be, rows, kvcache.FormatFP8UE8M0)
	b.SetBytes(rows * (1024 + 584))
	for b.Loop() {
		if err := be.KVNormRopeStore(context.Background(), ls[0], a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "cores")
}

// BenchmarkQ reports (token, head) rows per second at V4-Flash dims.
func BenchmarkQ(b *testing.B) {
	be := cpu.New(0)
	const rows = 256
	a, ls := flashLayer(b, be, rows, kvcache.FormatFP8UE8M0)
	b.SetBytes(rows * 64 * (1024 + 512))
	for b.Loop() {
		if err := be.QNormRopeQuant(context.Background(), ls[0], a); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*64*b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(float64(runtime.GOMAXPROCS(0)), "cores")
}

// quantBench times one chain kernel on rows rows of K values (V4-Flash:
// hidden 4096 for act_quant, q_lora_rank 1024 for q_norm).
func quantBench(b *testing.B, rows, k int, norm bool) {
	be := cpu.New(0)
	r := rand.New(rand.NewPCG(1, 3))
	x, _ := be.Alloc(rows * k * 2)
	p := cpu.Bytes(x)
	for i := 0; i+1 < len(p); i += 2 {
		binary.LittleEndian.PutUint16(p[i:], uint16(math.Float32bits(float32(r.NormFloat64()))>>16))
	}
	w, _ := be.Alloc(k * 4)
	for i := 0; i < k; i++ {
		binary.LittleEndian.PutUint32(cpu.Bytes(w)[4*i:], math.Float32bits(float32(1+0.1*r.NormFloat64())))
	}
	data, _ := be.Alloc(rows * k)
	scale, _ := be.Alloc(rows * k / 128 * 4)
	out := mla.FP8Activations{Rows: rows, K: k, Data: data, Scale: scale, ScaleStride: rows}
	ctx := context.Background()
	b.SetBytes(int64(rows * k * 3))
	for b.Loop() {
		var err error
		if norm {
			err = be.NormQuant(ctx, &mla.NormQuantArgs{X: x, XStride: k, Weight: w, Eps: 1e-6, Out: out})
		} else {
			err = be.ActQuant(ctx, &mla.ActQuantArgs{X: x, XStride: k, Out: out})
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
}

func BenchmarkActQuant(b *testing.B) {
	for _, rows := range []int{1, 256} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) { quantBench(b, rows, 4096, false) })
	}
}

func BenchmarkNormQuant(b *testing.B) {
	for _, rows := range []int{1, 256} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) { quantBench(b, rows, 1024, true) })
	}
}
