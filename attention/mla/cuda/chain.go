package cuda

import (
	"context"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
)

// The chain's bit-exact kernels (DESIGN.md section 7 steps 1 and 3) live in
// their own module, kernels/cuda/chain.cu.

var chainKernelNames = []string{"act_quant", "norm_quant"}

// loadChain compiles (or loads from the cache) the chain module and looks
// up its kernels.
func (b *Backend) loadChain() error {
	var err error
	if b.chainMod, err = b.load(chainProgram); err != nil {
		return err
	}
	for _, n := range chainKernelNames {
		if b.fns[n], err = b.chainMod.Function(n); err != nil {
			return err
		}
	}
	// The widest row's block (one warp and the staged weight) is past the
	// 48 KiB a launch gets without asking.
	return b.fns["norm_quant"].SetAttribute(driver.FuncMaxDynamicSharedSizeBytes, normQuantShared(1, mla.MaxNormQuantK))
}

// chainGrid caps a grid-stride launch's blocks (cudatune.Knobs.MaxBlocks, when
// set, caps it instead, so tests can make a few warps loop).
func (b *Backend) chainGrid(blocks int) uint32 { return b.waveGrid(blocks, chainBlocksPerSM) }

// chainBlocksPerSM is chainGrid's cap, blocks a multiprocessor.
const chainBlocksPerSM = 16

// waveGrid is a grid of blocks blocks, at most perSM a multiprocessor
// (Knobs.MaxBlocks, where set, instead), at least one.
func (b *Backend) waveGrid(blocks, perSM int) uint32 {
	limit := b.ctx.Props().SMCount * perSM
	if b.knobs.MaxBlocks > 0 {
		limit = b.knobs.MaxBlocks
	}
	return uint32(max(1, min(blocks, limit)))
}

// quantPointers resolves a validated call's device addresses.
func quantPointers(x mla.Buffer, xOffset, xStride int, out *mla.FP8Activations) (xp, data, scale driver.DevicePtr, err error) {
	rows, k := out.Rows, out.K
	if xp, err = span(x, xOffset, ((rows-1)*xStride+k)*2); err != nil {
		return
	}
	if data, err = span(out.Data, 0, rows*k); err != nil {
		return
	}
	scale, err = span(out.Scale, 0, ((k/128-1)*out.ScaleStride+rows)*4)
	return
}

// ActQuant implements mla.ChainBackend: act_quant of each bf16 row, one
// half-warp per 128-value block.
func (b *Backend) ActQuant(ctx context.Context, a *mla.ActQuantArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Out.Rows == 0 {
		return nil
	}
	params, err := actQuantParams(a)
	if err != nil {
		return err
	}
	const warps = abi.ChainWarps
	pairs := (a.Out.Rows*(a.Out.K/128) + 1) / 2
	grid := driver.Dim3{b.chainGrid((pairs + warps - 1) / warps), 1, 1}
	return b.launchShared(b.fns["act_quant"], grid, driver.Dim3{32 * warps, 1, 1}, 0, driver.Bytes(params))
}

// quantParams packs act_quant's or norm_quant's QuantParams: X at its
// offset (row stride in bytes), Out's data and scales, the norm weight and
// eps (0 and 0 for act_quant).
func quantParams(x mla.Buffer, xOffset, xStride int, out *mla.FP8Activations, weight driver.DevicePtr, eps float32) ([]byte, error) {
	xp, data, scale, err := quantPointers(x, xOffset, xStride, out)
	if err != nil {
		return nil, err
	}
	p := abi.QuantParams.Pack()
	p.Ptr(abi.QuantX, uint64(xp))
	p.U64(abi.QuantXStride, uint64(xStride)*2)
	p.Ptr(abi.QuantWeight, uint64(weight))
	p.Ptr(abi.QuantOut, uint64(data))
	p.Ptr(abi.QuantScale, uint64(scale))
	p.I32(abi.QuantRows, int32(out.Rows))
	p.I32(abi.QuantK, int32(out.K))
	p.I32(abi.QuantScaleStride, int32(out.ScaleStride))
	p.F32(abi.QuantEps, eps)
	return p.Bytes()
}

// actQuantParams packs a validated ActQuant call's parameters.
func actQuantParams(a *mla.ActQuantArgs) ([]byte, error) {
	return quantParams(a.X, a.XOffset, a.XStride, &a.Out, 0, 0)
}

// normQuantParams packs a validated NormQuant call's parameters.
func normQuantParams(a *mla.NormQuantArgs) ([]byte, error) {
	w, err := span(a.Weight, 0, 4*a.Out.K)
	if err != nil {
		return nil, err
	}
	return quantParams(a.X, a.XOffset, a.XStride, &a.Out, w, a.Eps)
}

// normQuantWarps is the warps a block of norm_quant gets for rows of k
// values: each stages its row in 2k+256 bytes of shared memory, and a block
// stays within the default 48 KiB.
func normQuantWarps(k int) int { return max(1, min(abi.ChainWarps, ((48<<10)-4*k)/(2*k+256))) }

// normQuantShared is the dynamic shared memory of a norm_quant block of
// warps warps: a 2k + 256-byte row slot a warp, then the staged weight.
func normQuantShared(warps, k int) int { return warps*(2*k+256) + 4*k }

// normQuantBlockWarps spreads a launch's rows over the SMs: a decode batch
// (128 rows) gets one warp a block on 128 SMs instead of 16 blocks of 8,
// each row waiting on its own loads (norm_quant is latency-bound there).
func normQuantBlockWarps(rows, k, sms int) int {
	return max(1, min(normQuantWarps(k), rows/max(1, sms)))
}

// NormQuant implements mla.ChainBackend: q_norm fused with act_quant, one
// warp per row.
func (b *Backend) NormQuant(ctx context.Context, a *mla.NormQuantArgs) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := a.Validate(); err != nil {
		return err
	}
	if a.Out.Rows == 0 {
		return nil
	}
	params, err := normQuantParams(a)
	if err != nil {
		return err
	}
	warps := normQuantBlockWarps(a.Out.Rows, a.Out.K, b.ctx.Props().SMCount)
	grid := driver.Dim3{b.chainGrid((a.Out.Rows + warps - 1) / warps), 1, 1}
	return b.launchShared(b.fns["norm_quant"], grid, driver.Dim3{uint32(32 * warps), 1, 1}, normQuantShared(warps, a.Out.K),
		driver.Bytes(params))
}

// Confirm the methods match mla.ChainBackend's (GEMM is not part of this file).
var (
	_ func(*Backend, context.Context, *mla.ActQuantArgs) error  = (*Backend).ActQuant
	_ func(*Backend, context.Context, *mla.NormQuantArgs) error = (*Backend).NormQuant
)
