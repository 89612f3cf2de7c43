// Command bench measures the CUDA prologue kernels on the device: every
// kernel over generation and context batch shapes, for V4-Flash and V4-Pro
// dims and each cache format, with CUDA events around L2-flushed launches
// (median of many), against a device-to-device copy measured in the same
// run; and a whole decode iteration launched eagerly from Go and as a CUDA
// graph. It writes JSON for bench/report.py, which joins it with the PyTorch
// peers (bench/peers.py). With --check-dir it also writes small cases as
// safetensors for bench/check_peers.py, after checking them byte for byte
// against the CPU backend.
package main

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/internal/cudatune"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/metadata"
	"github.com/dsv4mla/prologue/model/dsv4"
	"github.com/dsv4mla/prologue/numerics"
)

//go:embed fill.cu
var fillSource string

// contiguousLatent (--contiguous-latent) lays the latent rows out densely,
// to measure what the fused rows' stride costs.
var contiguousLatent bool

// variantKernels (--variant-kernels) times the kernels under the variants
// too, not only the decode iteration.
var variantKernels bool

type model struct {
	Name         string
	Heads, QLora int
	Layers       int
	cfg          dsv4.Config
}

type shape struct {
	Phase      string
	Batch, MTP int
	Tokens     int
	reqs       []metadata.Request
	cached     map[uint64]int
}

// Result is one kernel on one shape.
type Result struct {
	Kernel  string  `json:"kernel"`
	Model   string  `json:"model"`
	Format  string  `json:"format"`
	Phase   string  `json:"phase"`
	Batch   int     `json:"batch"`
	MTP     int     `json:"mtp"`
	Tokens  int     `json:"tokens"`
	Us      float64 `json:"us"`
	Bytes   int64   `json:"bytes"`
	GBps    float64 `json:"gbps"`
	PctCopy float64 `json:"pct_copy"`
	// CopyUs is a copy of the same bytes timed the same way, and
	// PctSameSize our rate as a share of its rate.
	CopyUs      float64 `json:"copy_us"`
	PctSameSize float64 `json:"pct_same_size_copy"`
	Variant     string  `json:"variant,omitempty"`
}

// Iteration is a whole decode step: every layer's KV and Q launches.
type Iteration struct {
	Model   string  `json:"model"`
	Batch   int     `json:"batch"`
	MTP     int     `json:"mtp"`
	Layers  int     `json:"layers"`
	EagerUs float64 `json:"eager_us"`
	GraphUs float64 `json:"graph_us"`
	Speedup float64 `json:"graph_speedup"`
	HostUs  float64 `json:"eager_host_us"`
	Variant string  `json:"variant,omitempty"`
}

// Report is the JSON output.
type Report struct {
	Device    string      `json:"device"`
	Date      string      `json:"date"`
	Command   string      `json:"command"`
	CopyGBps  float64     `json:"copy_gbps"`
	Results   []Result    `json:"results"`
	Iteration []Iteration `json:"iteration"`
	// IterationVariants are the decode iteration under the --variants.
	IterationVariants []Iteration `json:"iteration_variants,omitempty"`
	Checks            []string    `json:"checks"`
	// StridedCopy is a copy with the KV kernel's read pattern, L2-flushed
	// like the kernels: the ceiling for reading the latent in place.
	StridedCopy      []StridedCopy `json:"strided_copy"`
	ContiguousLatent bool          `json:"contiguous_latent,omitempty"`
}

// StridedCopy reads 1 KiB of every StrideBytes and writes it densely.
type StridedCopy struct {
	Model       string  `json:"model"`
	Rows        int     `json:"rows"`
	StrideBytes int     `json:"stride_bytes"`
	Us          float64 `json:"us"`
	GBps        float64 `json:"gbps"`
}

type bench struct {
	be       *cuda.Backend
	ctx      *driver.Context
	fillBF16 *driver.Function
	fillF32  *driver.Function
	copy16   *driver.Function
	copyRows *driver.Function
	flush    mla.Buffer
	copySrc  mla.Buffer
	copyDst  mla.Buffer
	reps     int
	seed     uint32
	copyGBps float64
}

func main() {
	out := flag.String("out", "bench-go.json", "JSON report")
	checkDir := flag.String("check-dir", "", "write small cases as safetensors for bench/check_peers.py")
	reps := flag.Int("reps", 50, "timed repetitions per kernel and shape (median)")
	models := flag.String("models", "flash,pro", "models")
	formats := flag.String("formats", "fp8_ue8m0,bf16,fp8_pertensor", "cache formats")
	variants := flag.String("variants", "", "extra kernel variants to time, ';'-separated option sets, e.g. 'warps=4 kvd=8;qd=6;bpsm=8'")
	quick := flag.Bool("quick", false, "a few shapes only")
	mainVariant := flag.String("variant", "", "option set of the main variant (see --variants; empty: the defaults)")
	verbose := flag.Bool("verbose", false, "print ptxas's register report of the kernels")
	vk := flag.Bool("variant-kernels", true, "also time every kernel and shape under the --variants (false: only the decode iteration)")
	contiguous := flag.Bool("contiguous-latent", false, "diagnostic: read the latent from a contiguous [T][512] buffer instead of the fused A rows")
	flag.Parse()
	contiguousLatent, variantKernels = *contiguous, *vk
	if err := run(*out, *checkDir, *reps, *models, *formats, *mainVariant, *variants, *quick, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// variant is one option set: the backend's Options and the launch-shape
// knobs (embedded, so that parseVariant sets either by name).
type variant struct {
	cuda.Options
	cudatune.Knobs
}

func newBench(opts variant, reps int) (*bench, error) {
	be, err := cuda.NewTuned(opts.Options, opts.Knobs)
	if err != nil {
		return nil, err
	}
	b := &bench{be: be, ctx: be.Context(), reps: reps, seed: 1}
	mod, err := b.ctx.CompileModule(fillSource, "fill.cu", driver.CompileOptions{})
	if err != nil {
		return nil, err
	}
	if b.fillBF16, err = mod.Function("fill_bf16"); err != nil {
		return nil, err
	}
	if b.fillF32, err = mod.Function("fill_f32"); err != nil {
		return nil, err
	}
	if b.copy16, err = mod.Function("copy16"); err != nil {
		return nil, err
	}
	if b.copyRows, err = mod.Function("copy_rows"); err != nil {
		return nil, err
	}
	if b.flush, err = be.Alloc(256 << 20); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *bench) grid() driver.Dim3 { return driver.Dim3{uint32(b.be.Props().SMCount * 16), 1, 1} }

func (b *bench) randBF16(n int, rowElems int) (mla.Buffer, error) {
	buf, err := b.be.Alloc(2 * n)
	if err != nil {
		return nil, err
	}
	b.seed++
	return buf, b.ctx.Launch(b.fillBF16, b.grid(), driver.Dim3{256, 1, 1}, 0, b.be.Stream(),
		buf.(*cuda.Buffer).Ptr(), uint64(n), b.seed, uint32(rowElems))
}

func (b *bench) randF32(n int, lo, hi float32) (mla.Buffer, error) {
	buf, err := b.be.Alloc(4 * n)
	if err != nil {
		return nil, err
	}
	b.seed++
	return buf, b.ctx.Launch(b.fillF32, b.grid(), driver.Dim3{256, 1, 1}, 0, b.be.Stream(),
		buf.(*cuda.Buffer).Ptr(), uint64(n), b.seed, lo, hi)
}

const copyMax = 1 << 30

// measureCopy times a 1 GiB device-to-device copy both ways the device
// offers (cuMemcpyDtoD and a 16-byte streaming copy kernel), counting bytes
// read and written, and returns the faster: the ceiling every kernel is
// compared with.
func (b *bench) measureCopy() (float64, error) {
	var err error
	if b.copySrc, err = b.be.Alloc(copyMax); err != nil {
		return 0, err
	}
	if b.copyDst, err = b.be.Alloc(copyMax); err != nil {
		return 0, err
	}
	var memcpy, kernel []float64
	// Ten copies back to back between two events, issued in one hand-over
	// to the driver thread so no host gap lands inside the timed span; the
	// first rounds warm the clocks up.
	const perRound = 10
	timeCopies := func(one func() error) (float64, error) {
		d, err := b.be.Time(context.Background(), func() error {
			return b.ctx.Do(func() error {
				for range perRound {
					if err := one(); err != nil {
						return err
					}
				}
				return nil
			})
		})
		return d.Seconds() / perRound, err
	}
	for i := 0; i < 8; i++ {
		d, err := timeCopies(func() error {
			return b.ctx.DtoDAsync(b.copyDst.(*cuda.Buffer).Ptr(), b.copySrc.(*cuda.Buffer).Ptr(), copyMax, b.be.Stream())
		})
		if err != nil {
			return 0, err
		}
		k, err := timeCopies(func() error { return b.launchCopy(copyMax) })
		if err != nil {
			return 0, err
		}
		if i >= 3 {
			memcpy = append(memcpy, d)
			kernel = append(kernel, k)
		}
	}
	m, k := 2*copyMax/median(memcpy)/1e9, 2*copyMax/median(kernel)/1e9
	fmt.Printf("copy 1 GiB: cuMemcpyDtoD %.0f GB/s, copy kernel %.0f GB/s (read+write)\n", m, k)
	return max(m, k), nil
}

func (b *bench) launchCopy(n int) error {
	return b.ctx.Launch(b.copy16, driver.Dim3{uint32(b.be.Props().SMCount * 8), 1, 1}, driver.Dim3{512, 1, 1}, 0, b.be.Stream(),
		b.copyDst.(*cuda.Buffer).Ptr(), b.copySrc.(*cuda.Buffer).Ptr(), uint64(n/16))
}

// sameSizeCopyUs times, like the kernels, a copy that moves the same bytes
// (half read, half written): the fixed cost of a launch and its first DRAM
// round trips weighs on small shapes too, and this shows how much.
func (b *bench) sameSizeCopyUs(bytes int64) (float64, error) {
	n := int(min(bytes/2, copyMax)) &^ 15
	us, err := b.timeLaunch(func() error { return b.launchCopy(max(n, 16)) })
	if bytes/2 > copyMax { // past the copy buffers: scale the 1 GiB time
		us *= float64(bytes/2) / copyMax
	}
	return us, err
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return math.NaN()
	}
	return s[len(s)/2]
}

// timeLaunch returns the median device time of launch, each repetition
// preceded by a 256 MiB memset that evicts the L2.
func (b *bench) timeLaunch(launch func() error) (float64, error) {
	n := b.reps + 3
	events := make([]*driver.Event, 2*n)
	for i := range events {
		e, err := b.ctx.NewEvent(true)
		if err != nil {
			return 0, err
		}
		defer e.Destroy()
		events[i] = e
	}
	s := b.be.Stream()
	flush := b.flush.(*cuda.Buffer)
	err := b.ctx.Do(func() error {
		for i := 0; i < n; i++ {
			if err := b.ctx.Memset8Async(flush.Ptr(), byte(i), flush.Len(), s); err != nil {
				return err
			}
			if err := events[2*i].Record(s); err != nil {
				return err
			}
			if err := launch(); err != nil {
				return err
			}
			if err := events[2*i+1].Record(s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := s.Synchronize(); err != nil {
		return 0, err
	}
	var us []float64
	for i := 3; i < n; i++ {
		ms, err := b.ctx.ElapsedMs(events[2*i], events[2*i+1])
		if err != nil {
			return 0, err
		}
		us = append(us, float64(ms)*1000)
	}
	return median(us), nil
}

func shapes(quick bool) []shape {
	var out []shape
	r := rand.New(rand.NewPCG(7, 7))
	bs, mtps, ctxs := []int{1, 8, 32, 128, 256}, []int{0, 3}, []int{1024, 4096, 16384, 65536}
	if quick {
		bs, ctxs = []int{1, 32}, []int{4096}
	}
	for _, mtp := range mtps {
		for _, nb := range bs {
			s := shape{Phase: "generation", Batch: nb, MTP: mtp, Tokens: nb * (1 + mtp), cached: map[uint64]int{}}
			for i := 0; i < nb; i++ {
				id := uint64(i + 1)
				s.reqs = append(s.reqs, metadata.Request{Seq: id, Phase: metadata.Generation, MTP: mtp})
				s.cached[id] = 1 + r.IntN(4000)
			}
			out = append(out, s)
		}
	}
	for _, t := range ctxs {
		chunk := min(t, 2048)
		s := shape{Phase: "context", Batch: t / chunk, Tokens: t, cached: map[uint64]int{}}
		for i := 0; i < t/chunk; i++ {
			id := uint64(i + 1)
			s.reqs = append(s.reqs, metadata.Request{Seq: id, Phase: metadata.Context, NewTokens: chunk})
			if i%2 == 1 {
				s.cached[id] = 2048 // a chunked-prefill continuation
			}
		}
		out = append(out, s)
	}
	return out
}

// layerSetup is one model and shape's buffers.
type layerSetup struct {
	m        *metadata.Metadata
	args     mla.LayerArgs
	launches []mla.Launch
	pages    int
	bufs     []mla.Buffer
}

func (b *bench) free(ls *layerSetup) {
	for _, buf := range ls.bufs {
		_ = b.be.Free(buf)
	}
}

func (b *bench) setup(md model, s shape, formats []kvcache.Format) (*layerSetup, error) {
	const pageSize, ropePositions = 64, 8192
	plan, err := metadata.NewPlan(s.reqs, func(id uint64) (int, bool, error) { n, ok := s.cached[id]; return n, ok, nil },
		metadata.Params{Heads: md.Heads, PageSize: pageSize, MaxPositions: ropePositions, Scheduler: metadata.DefaultSchedulerParams()})
	if err != nil {
		return nil, err
	}
	total := 0
	for _, n := range plan.Needs() {
		total += (n.Length + pageSize - 1) / pageSize
	}
	perm := rand.New(rand.NewPCG(uint64(total), 3)).Perm(total)
	tables := map[uint64][]int32{}
	for _, n := range plan.Needs() {
		for i := 0; i < (n.Length+pageSize-1)/pageSize; i++ {
			tables[n.Seq] = append(tables[n.Seq], int32(perm[0]))
			perm = perm[1:]
		}
	}
	m, err := plan.Build(func(id uint64) ([]int32, error) { return tables[id], nil })
	if err != nil {
		return nil, err
	}
	ls := &layerSetup{m: m, pages: total, launches: mla.Plan(m)}
	a := &ls.args
	keep := func(buf mla.Buffer, err error) (mla.Buffer, error) {
		if err == nil {
			ls.bufs = append(ls.bufs, buf)
		}
		return buf, err
	}
	T := m.PaddedTokens
	rowElems := md.QLora + 512
	if contiguousLatent {
		rowElems = 512
	}
	steps := []func() error{
		func() (err error) { a.Latent, err = keep(b.randBF16(T*rowElems, rowElems)); return },
		func() (err error) { a.QIn, err = keep(b.randBF16(T*md.Heads*512, 512)); return },
		func() (err error) { a.QOut, err = keep(b.be.Alloc(T * md.Heads * 512)); return },
		func() (err error) { a.KVWeight, err = keep(b.randF32(512, 0.5, 1.5)); return },
		func() (err error) { a.Rope, err = keep(b.randF32(ropePositions*64, -1, 1)); return },
		func() (err error) {
			a.Cache, err = keep(b.be.Alloc(kvcache.FormatBF16.PageBytes(pageSize) * total))
			return
		},
	}
	for _, st := range steps {
		if err := st(); err != nil {
			b.free(ls)
			return nil, err
		}
	}
	a.Heads, a.LatentOffset, a.LatentStride = md.Heads, (rowElems-512)*2, rowElems
	a.RopePositions, a.QFormat, a.QScale, a.Eps = ropePositions, mla.QFP8, 1, numerics.DefaultEps
	a.Scheduler = metadata.DefaultSchedulerParams()
	a.CacheConfig = kvcache.Config{Format: formats[0], PageSize: pageSize, NumPages: total, KVScale: 1}
	if a.Meta, err = mla.NewMetadataBuffers(b.be, m.NumSeqs, m.MaxPages); err != nil {
		b.free(ls)
		return nil, err
	}
	ls.bufs = append(ls.bufs, a.Meta.Buf)
	if err := a.Meta.Upload(b.be, m, total); err != nil {
		b.free(ls)
		return nil, err
	}
	return ls, b.be.Synchronize(context.Background())
}

func kvBytes(t int, f kvcache.Format) int64 { return int64(t) * int64(1024+256+f.BytesPerToken()) }
func qBytes(t, heads int) int64             { return int64(t) * (int64(heads)*1536 + 256) }

// parseVariant reads an option set: warps=N kvd=N qd=N bpsm=N pdl.
func parseVariant(v string) (variant, error) {
	var o variant
	for _, f := range strings.Fields(v) {
		k, val, _ := strings.Cut(f, "=")
		n, _ := strconv.Atoi(val)
		switch k {
		case "warps":
			o.Warps = n
		case "kvd":
			o.KVDepth = n
		case "qd":
			o.QDepth = n
		case "bpsm":
			o.BlocksPerSM = n
		case "maxblocks":
			o.MaxBlocks = n
		case "nopdl":
			o.NoPDL = true
		case "separate":
			o.SeparateLaunches = true
		default:
			return o, fmt.Errorf("variant %q: unknown option %q", v, k)
		}
	}
	return o, nil
}

func run(out, checkDir string, reps int, modelList, formatList, mainVariant, variantList string, quick, verbose bool) error {
	if err := cuda.Available(); err != nil {
		return err
	}
	if contiguousLatent && checkDir != "" {
		return fmt.Errorf("--contiguous-latent is a diagnostic: the --check-dir cases need the fused rows")
	}
	var formats []kvcache.Format
	for _, f := range strings.Split(formatList, ",") {
		ff, err := kvcache.ParseFormat(f)
		if err != nil {
			return err
		}
		formats = append(formats, ff)
	}
	var models []model
	for _, name := range strings.Split(modelList, ",") {
		switch name {
		case "flash":
			c := dsv4.Flash()
			models = append(models, model{"flash", c.NumHeads, c.QLoraRank, c.NumLayers, c})
		case "pro":
			c := dsv4.Pro()
			models = append(models, model{"pro", c.NumHeads, c.QLoraRank, c.NumLayers, c})
		default:
			return fmt.Errorf("unknown model %q", name)
		}
	}
	mainOpts, err := parseVariant(mainVariant)
	if err != nil {
		return err
	}
	mainOpts.Verbose = verbose
	b, err := newBench(mainOpts, reps)
	if err != nil {
		return err
	}
	if verbose {
		fmt.Println(b.be.CompileLog())
	}
	rep := Report{Device: b.be.Props().Name, Date: time.Now().UTC().Format(time.RFC3339), Command: strings.Join(os.Args, " "), ContiguousLatent: contiguousLatent}
	if rep.CopyGBps, err = b.measureCopy(); err != nil {
		return err
	}
	b.copyGBps = rep.CopyGBps
	fmt.Printf("device %s, copy %.0f GB/s (read+write)\n", rep.Device, rep.CopyGBps)
	for _, md := range models {
		const rows = 65536
		stride := uint64(md.QLora+512) * 2
		us, err := b.timeLaunch(func() error {
			return b.ctx.Launch(b.copyRows, driver.Dim3{uint32(b.be.Props().SMCount * 8), 1, 1}, driver.Dim3{512, 1, 1}, 0, b.be.Stream(),
				b.copyDst.(*cuda.Buffer).Ptr(), b.copySrc.(*cuda.Buffer).Ptr(), uint64(rows), stride)
		})
		if err != nil {
			return err
		}
		gbps := float64(2*rows*1024) / us / 1e3
		rep.StridedCopy = append(rep.StridedCopy, StridedCopy{Model: md.Name, Rows: rows, StrideBytes: int(stride), Us: us, GBps: gbps})
		fmt.Printf("strided copy %s: 1 KiB of every %d bytes, %d rows: %.1f us, %.0f GB/s (%.1f%% of copy)\n", md.Name, stride, rows, us, gbps, 100*gbps/rep.CopyGBps)
	}
	benches := []*bench{b}
	names := []string{mainVariant}
	if variantList != "" {
		for _, v := range strings.Split(variantList, ";") {
			o, err := parseVariant(v)
			if err != nil {
				return err
			}
			vb, err := newBench(o, reps)
			if err != nil {
				return err
			}
			benches, names = append(benches, vb), append(names, v)
		}
	}
	fmt.Printf("%-6s %-5s %-14s %-10s %5s %3s %6s %10s %8s %6s %6s\n", "kernel", "model", "format", "phase", "batch", "mtp", "tokens", "us", "GB/s", "%copy", "%same")
	for _, md := range models {
		for _, s := range shapes(quick) {
			ls, err := b.setup(md, s, formats)
			if err != nil {
				return fmt.Errorf("%s %s %d: %w", md.Name, s.Phase, s.Tokens, err)
			}
			for vi, vb := range benches {
				if vi > 0 && !variantKernels {
					continue
				}
				variant := ""
				if vi > 0 {
					variant = names[vi]
				}
				var resErr error
				res := func(kernel, format string, us float64, bytes int64) {
					r := Result{Kernel: kernel, Model: md.Name, Format: format, Phase: s.Phase, Batch: s.Batch, MTP: s.MTP,
						Tokens: s.Tokens, Us: us, Bytes: bytes, GBps: float64(bytes) / us / 1e3, Variant: variant}
					r.PctCopy = 100 * r.GBps / rep.CopyGBps
					if vi == 0 {
						cu, err := b.sameSizeCopyUs(bytes)
						if err != nil {
							resErr = err
						}
						r.CopyUs, r.PctSameSize = cu, 100*cu/us
					}
					rep.Results = append(rep.Results, r)
					fmt.Printf("%-6s %-5s %-14s %-10s %5d %3d %6d %10.2f %8.0f %5.1f%% %5.1f%% %s\n", kernel, md.Name, format, s.Phase, s.Batch, s.MTP, s.Tokens, us, r.GBps, r.PctCopy, r.PctSameSize, variant)
				}
				for _, f := range formats {
					a := ls.args
					a.CacheConfig.Format = f
					us, err := vb.timeLaunch(func() error { return vb.be.KVNormRopeStore(context.Background(), ls.launchesAll(), &a) })
					if err != nil {
						return err
					}
					res("kv", f.String(), us, kvBytes(s.Tokens, f))
				}
				a := ls.args
				us, err := vb.timeLaunch(func() error { return vb.be.QNormRopeQuant(context.Background(), ls.launchesAll(), &a) })
				if err != nil {
					return err
				}
				res("q", "fp8", us, qBytes(s.Tokens, md.Heads))
				if resErr != nil {
					return resErr
				}
			}
			b.free(ls)
		}
		for vi, vb := range benches {
			it, err := vb.iteration(md, 32, 3)
			if err != nil {
				return err
			}
			if vi == 0 {
				rep.Iteration = append(rep.Iteration, it)
			} else {
				it.Variant = names[vi]
				rep.IterationVariants = append(rep.IterationVariants, it)
			}
			fmt.Printf("iteration %s b=%d mtp=%d layers=%d: eager %.1f us (host %.1f us), graph %.1f us, %.2fx %s\n",
				it.Model, it.Batch, it.MTP, it.Layers, it.EagerUs, it.HostUs, it.GraphUs, it.Speedup, it.Variant)
		}
	}
	if checkDir != "" {
		if rep.Checks, err = b.writeChecks(checkDir, models[0]); err != nil {
			return err
		}
	}
	data, err := json.MarshalIndent(rep, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, data, 0o644)
}

// launchesAll is the single launch covering the whole batch of a one-phase
// shape (every benchmark shape is one phase).
func (ls *layerSetup) launchesAll() mla.Launch { return ls.launches[0] }

// iteration times a whole decode step: every layer's KV and Q launch, with
// per-layer inputs, eagerly from Go (one hand-over to the driver thread per
// layer, as a server calls the engine per layer) and as a CUDA graph.
func (b *bench) iteration(md model, nb, mtp int) (Iteration, error) {
	var s shape
	for _, sh := range shapes(false) {
		if sh.Phase == "generation" && sh.Batch == nb && sh.MTP == mtp {
			s = sh
		}
	}
	var layers []*layerSetup
	defer func() {
		for _, ls := range layers {
			b.free(ls)
		}
	}()
	for l := 0; l < md.Layers; l++ {
		ls, err := b.setup(md, s, []kvcache.Format{kvcache.FormatFP8UE8M0})
		if err != nil {
			return Iteration{}, err
		}
		if l > 0 { // one metadata buffer per iteration, shared by every layer
			ls.args.Meta = layers[0].args.Meta
		}
		layers = append(layers, ls)
	}
	ctx := context.Background()
	step := func() error {
		for _, ls := range layers {
			if err := mla.RunLayer(ctx, b.be, ls.launches, &ls.args); err != nil {
				return err
			}
		}
		return nil
	}
	var eager, host []float64
	for i := 0; i < 23; i++ {
		t0 := time.Now()
		d, err := b.be.Time(ctx, step)
		if err != nil {
			return Iteration{}, err
		}
		if i >= 3 {
			eager = append(eager, float64(d.Microseconds()))
			host = append(host, float64(time.Since(t0).Microseconds()))
		}
	}
	g, err := b.be.Capture(func() error {
		for _, ls := range layers {
			if err := mla.RunLayer(ctx, b.be, ls.launches, &ls.args); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Iteration{}, err
	}
	defer g.Close()
	var graph []float64
	for i := 0; i < 23; i++ {
		d, err := b.be.Time(ctx, g.Launch)
		if err != nil {
			return Iteration{}, err
		}
		if i >= 3 {
			graph = append(graph, float64(d.Nanoseconds())/1e3)
		}
	}
	it := Iteration{Model: md.Name, Batch: nb, MTP: mtp, Layers: md.Layers, EagerUs: median(eager), GraphUs: median(graph), HostUs: median(host)}
	it.Speedup = it.EagerUs / it.GraphUs
	return it, nil
}

// writeChecks runs small cases on the GPU, checks every byte against the
// CPU backend, and writes them for bench/check_peers.py.
func (b *bench) writeChecks(dir string, md model) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var notes []string
	cases := []struct {
		name   string
		s      shape
		format kvcache.Format
		qbf16  bool
	}{}
	for _, sh := range shapes(false) {
		if sh.Phase == "generation" && sh.Batch == 8 && sh.MTP == 3 {
			for _, f := range kvcache.Formats() {
				cases = append(cases, struct {
					name   string
					s      shape
					format kvcache.Format
					qbf16  bool
				}{"gen_b8_mtp3_" + f.String(), sh, f, false})
			}
		}
		if sh.Phase == "context" && sh.Tokens == 1024 {
			cases = append(cases, struct {
				name   string
				s      shape
				format kvcache.Format
				qbf16  bool
			}{"ctx_1024_fp8_ue8m0_qbf16", sh, kvcache.FormatFP8UE8M0, true})
		}
	}
	ctx := context.Background()
	host := cpu.New(0)
	for _, c := range cases {
		ls, err := b.setup(md, c.s, []kvcache.Format{c.format})
		if err != nil {
			return nil, err
		}
		a := ls.args
		if c.qbf16 {
			a.QFormat = mla.QBF16
			a.QOut, _ = b.be.Alloc(ls.m.PaddedTokens * md.Heads * 1024)
			ls.bufs = append(ls.bufs, a.QOut)
		}
		a.CacheConfig.KVScale = 0.75
		a.QScale = 1.5
		poolBytes := a.CacheConfig.PoolBytes()
		cacheIn := make([]byte, poolBytes)
		for i := range cacheIn {
			cacheIn[i] = byte(i*7 + 3)
		}
		if err := b.be.Write(a.Cache, 0, cacheIn); err != nil {
			return nil, err
		}
		if err := mla.RunLayer(ctx, b.be, ls.launches, &a); err != nil {
			return nil, err
		}
		read := func(buf mla.Buffer, n int) ([]byte, error) {
			p := make([]byte, n)
			return p, b.be.Read(p, buf, 0)
		}
		T := ls.m.PaddedTokens
		rowElems := md.QLora + 512
		fused, err := read(a.Latent, T*rowElems*2)
		if err != nil {
			return nil, err
		}
		qin, _ := read(a.QIn, T*md.Heads*1024)
		w, _ := read(a.KVWeight, 2048)
		rope, _ := read(a.Rope, a.RopePositions*256)
		cacheOut, _ := read(a.Cache, poolBytes)
		qout, err := read(a.QOut, T*md.Heads*512*a.QFormat.ElemBytes())
		if err != nil {
			return nil, err
		}
		// The same layer on the CPU backend must give the same bytes.
		ha := a
		up := func(p []byte) mla.Buffer { buf, _ := host.Alloc(len(p)); _ = host.Write(buf, 0, p); return buf }
		ha.Latent, ha.QIn, ha.KVWeight, ha.Rope, ha.Cache = up(fused), up(qin), up(w), up(rope), up(cacheIn)
		ha.QOut, _ = host.Alloc(len(qout))
		if ha.Meta, err = mla.NewMetadataBuffers(host, ls.m.NumSeqs, ls.m.MaxPages); err != nil {
			return nil, err
		}
		if err := ha.Meta.Upload(host, ls.m, ls.pages); err != nil {
			return nil, err
		}
		if err := mla.RunLayer(ctx, host, ls.launches, &ha); err != nil {
			return nil, err
		}
		if d := firstDiff(cpu.Bytes(ha.Cache), cacheOut); d >= 0 {
			return nil, fmt.Errorf("check %s: GPU cache differs from the CPU backend at byte %d", c.name, d)
		}
		if d := firstDiff(cpu.Bytes(ha.QOut), qout); d >= 0 {
			return nil, fmt.Errorf("check %s: GPU Q differs from the CPU backend at byte %d", c.name, d)
		}
		positions := make([]byte, 4*T)
		slots := make([]byte, 8*T)
		for t := 0; t < T; t++ {
			_, pos, _ := ls.m.Row(t)
			binary.LittleEndian.PutUint32(positions[4*t:], uint32(pos))
			binary.LittleEndian.PutUint64(slots[8*t:], uint64(ls.m.Slot(t)))
		}
		pageBytes := c.format.PageBytes(64)
		qfmt, qshape := "fp8", []int{T, md.Heads, 512}
		if c.qbf16 {
			qfmt, qshape = "bf16", []int{T, md.Heads, 1024}
		}
		tensors := []safetensors.Tensor{
			{Name: "fused_a", DType: "BF16", Shape: []int{T, rowElems}, Data: fused},
			{Name: "q", DType: "BF16", Shape: []int{T, md.Heads, 512}, Data: qin},
			{Name: "kv_weight", DType: "F32", Shape: []int{512}, Data: w},
			{Name: "cos_sin", DType: "F32", Shape: []int{a.RopePositions, 32, 2}, Data: rope},
			{Name: "positions", DType: "I32", Shape: []int{T}, Data: positions},
			{Name: "slots", DType: "I64", Shape: []int{T}, Data: slots},
			{Name: "cache_in", DType: "U8", Shape: []int{ls.pages, pageBytes}, Data: cacheIn},
			{Name: "cache_out", DType: "U8", Shape: []int{ls.pages, pageBytes}, Data: cacheOut},
			{Name: "q_out", DType: "U8", Shape: qshape, Data: qout},
		}
		meta := map[string]string{
			"format": c.format.String(), "q_format": qfmt, "page_size": "64", "kv_scale": strconv.FormatFloat(float64(a.CacheConfig.KVScale), 'g', -1, 32),
			"q_scale": strconv.FormatFloat(float64(a.QScale), 'g', -1, 32), "q_lora_rank": strconv.Itoa(md.QLora), "heads": strconv.Itoa(md.Heads),
		}
		if err := safetensors.WriteFile(filepath.Join(dir, c.name+".safetensors"), tensors, meta); err != nil {
			return nil, err
		}
		note := fmt.Sprintf("%s: %d tokens, GPU == CPU backend byte for byte (%d cache bytes, %d Q bytes)", c.name, T, poolBytes, len(qout))
		fmt.Println("check", note)
		notes = append(notes, note)
		host.Free(ha.Latent)
		b.free(ls)
	}
	return notes, nil
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
