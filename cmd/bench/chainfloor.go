package main

import (
	"fmt"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// ChainFloor is the dependent-chain floor of a many-layer graph: a copy
// kernel (fill.cu chain_rows) that moves a layer's Q rows (1 KiB read, 512
// bytes written, as the FP8 Q prologue) and nothing else, each layer its
// own buffers, launched with programmatic dependent launch like the
// prologue and timed like LayerGraph. No prologue layer of that many rows
// in that setting can be faster than its floor by more than the noise.
// Prefetch: each warp first asks L2 for its row ahead of the wait, as the
// prologue's direct path does (the floor of that path).
type ChainFloor struct {
	Model      string  `json:"model"`
	Prefetch   bool    `json:"prefetch,omitempty"`
	Rows       int     `json:"rows"` // 1 KiB rows a layer copies
	Layers     int     `json:"layers"`
	TotalUs    float64 `json:"total_us"`
	UsPerLayer float64 `json:"us_per_layer"`
	Bytes      int64   `json:"bytes"` // a layer's bytes read and written
}

// chainFloors times chain_rows for a one-token batch's rows, b=32's and
// b=32 MTP 3's (128 tokens x heads), every layer of md in one graph.
func chainFloors(c *config, d *device, md model, rep *Report) error {
	for _, tokens := range []int{1, 32, 128} {
		for _, prefetch := range []bool{false, true} {
			if err := chainFloor(c, d, md, tokens, prefetch, rep); err != nil {
				return fmt.Errorf("chain floor, %d tokens (prefetch %v): %w", tokens, prefetch, err)
			}
		}
	}
	return nil
}

// chainFloor is chainFloors at one batch of tokens, with or without the L2
// prefetch ahead of the wait.
func chainFloor(c *config, d *device, md model, tokens int, prefetch bool, rep *Report) error {
	rows := tokens * md.Heads
	bufs := make([]mla.Buffer, 0, 2*md.Layers)
	defer func() {
		for _, b := range bufs {
			_ = d.be.Free(b)
		}
	}()
	for range md.Layers {
		src, err := d.randBF16(rows*512, 512)
		if err != nil {
			return err
		}
		bufs = append(bufs, src)
		dst, err := d.be.Alloc(rows * 512)
		if err != nil {
			return err
		}
		bufs = append(bufs, dst)
	}
	const warps = 4
	grid := driver.Dim3{uint32((rows + warps - 1) / warps), 1, 1}
	total, err := d.timeGraph(c.GraphReps, func() error {
		for l := range md.Layers {
			src, dst := bufs[2*l].(*cuda.Buffer), bufs[2*l+1].(*cuda.Buffer)
			if err := d.ctx.LaunchPDL(d.chainRow, grid, driver.Dim3{32 * warps, 1, 1}, 0, d.be.Stream(),
				src.Ptr(), dst.Ptr(), int32(rows), int32(512), boolInt32(prefetch)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	f := ChainFloor{Model: md.Name, Prefetch: prefetch, Rows: rows, Layers: md.Layers, TotalUs: total,
		UsPerLayer: total / float64(md.Layers), Bytes: int64(rows) * 1536}
	rep.ChainFloors = append(rep.ChainFloors, f)
	how := "PDL"
	if prefetch {
		how = "PDL, L2 prefetch"
	}
	fmt.Printf("floor %-5s %6d rows (%3d tokens) %2d layers: %8.1f us, %6.2f us/layer (copy kernel in the graph, %s; %5.1f%% of the copy rate)\n",
		f.Model, f.Rows, tokens, f.Layers, f.TotalUs, f.UsPerLayer, how, 100*safeDiv(float64(f.Bytes)/rep.CopyGBps/1e3, f.UsPerLayer))
	return nil
}

func boolInt32(b bool) int32 {
	if b {
		return 1
	}
	return 0
}
