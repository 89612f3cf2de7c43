package cuda

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/compressor"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
	"github.com/dsv4mla/prologue/kernels/cuda/driver"
	"github.com/dsv4mla/prologue/kvcache"
	"github.com/dsv4mla/prologue/numerics"
)

// The KV compressor's entries on the device (DESIGN.md section 8): the
// compress_entries kernel of kernels/cuda/compress.cu, bit-identical to
// package compressor. Its module is compiled and loaded at first use
// (LoadCompressor), so a backend that never compresses pays nothing.

// compressThreads is compress_entries' block: one thread per channel.
const compressThreads = numerics.HeadDim

// jobBytes is one job as the kernel reads it: int4 {index, cand, page, off}.
const jobBytes = 16

// compressState is the compressor module and the upload buffer of its job
// lists.
type compressState struct {
	mod     *driver.Module
	fn      *driver.Function // compress_entries
	step    *driver.Function // compress_step
	finish  *driver.Function // compress_step_finish
	ifinish *driver.Function // indexer_step_finish
	istep   *driver.Function // indexer_step
	iquery  *driver.Function // indexer_query
	iqearly *driver.Function // indexer_query_early
	iqlean  *driver.Function // indexer_query_lean
	iqwide  *driver.Function // indexer_query_wide
	iqstrm  *driver.Function // indexer_query_stream
	iqlane  *driver.Function // indexer_query_lane
	iqtok   *driver.Function // indexer_query_tok
	err     error            // a failed load, returned by every later call
	scratch mla.Buffer       // jobs then candidate codes of CompressEntries
}

// StateRow returns the candidate code of row `row` of CompressLayer's state
// space (StateK, StateG): ^row, a negative number. Rows of the new space
// (NewK, NewG) are their own codes, 0 and up.
func StateRow(row int) int32 { return ^int32(row) }

// CompressCandidates returns how many candidates entry index of a ratio
// pools: 128 for ratio 128; 8 for ratio 4 (the previous window's 4 tokens,
// then the current window's 4), 4 for entry 0 (no previous window).
func CompressCandidates(ratio, index int) int {
	if ratio == 4 && index == 0 {
		return 4
	}
	return compressor.Overlap(ratio) * ratio
}

// CompressLayer is one compressed layer's device inputs and pool, shared by
// the entries of a launch.
type CompressLayer struct {
	Ratio int // compress_ratio: 4 or 128
	// NewK, NewG: NewRows projection rows (the launch's own tokens), and
	// StateK, StateG: StateRows rows kept from earlier iterations; each row
	// is Width = compressor.Overlap(Ratio)*512 float32 values, G with ape
	// added. A space with no rows may have nil buffers.
	NewK, NewG     mla.Buffer
	NewRows        int
	StateK, StateG mla.Buffer
	StateRows      int
	NormWeight     mla.Buffer // compressor.norm.weight: 512 float32
	Eps            float32    // rms_norm_eps
	// Rope is the layer's RoPE table (YaRN) as dsv4.RopeTable.Bytes lays it
	// out, RopePositions rows of 64 float32; entry i reads row i*Ratio.
	Rope          mla.Buffer
	RopePositions int
	// Pool is the layer's compressed cache: NumPages pages of PageSize
	// entries in the fp8_ue8m0 layout (kvcache.FormatFP8UE8M0.PageBytes).
	Pool               mla.Buffer
	PageSize, NumPages int
}

// Width returns the float32 values of one projection row.
func (l *CompressLayer) Width() int { return compressor.Overlap(l.Ratio) * numerics.HeadDim }

// CompressJob is one entry to emit: window Index ([Index*r, (Index+1)*r)),
// pooled from Candidates (CompressCandidates(r, Index) codes, by ascending
// position: for ratio 4 the previous window's tokens first; a code >= 0 is
// a row of NewK/NewG, StateRow(row) a row of StateK/StateG), stored at
// in-page offset Offset of pool page Page. (The engine does not use these:
// its steps read a plan on the device, CompressStep; explicit candidate
// lists are the kernel tests' way to reach compress_entries.)
type CompressJob struct {
	Index        int
	Candidates   []int32
	Page, Offset int
}

// validate checks the layer's fields (not the jobs).
func (l *CompressLayer) validate() error {
	if compressor.Overlap(l.Ratio) == 0 {
		return fmt.Errorf("cuda: compress: Ratio = %d has no compressor (want 4 or 128)", l.Ratio)
	}
	w := l.Width()
	spaces := []struct {
		name string
		bufs [2]mla.Buffer
		rows int
	}{{"New", [2]mla.Buffer{l.NewK, l.NewG}, l.NewRows}, {"State", [2]mla.Buffer{l.StateK, l.StateG}, l.StateRows}}
	for _, s := range spaces {
		if s.rows < 0 || s.rows > math.MaxInt32 {
			return fmt.Errorf("cuda: compress: %sRows = %d out of range [0, %d]", s.name, s.rows, math.MaxInt32)
		}
		if s.rows == 0 {
			continue
		}
		for i, kg := range []string{"K", "G"} {
			if b := s.bufs[i]; b == nil || b.Len() < s.rows*w*4 {
				return fmt.Errorf("cuda: compress: %s%s must hold %sRows = %d rows of %d float32 (%d bytes)%s",
					s.name, kg, s.name, s.rows, w, s.rows*w*4, bufferSize(b))
			}
		}
	}
	if l.NormWeight == nil || l.NormWeight.Len() < 4*numerics.HeadDim {
		return fmt.Errorf("cuda: compress: NormWeight must hold %d float32 (%d bytes)%s", numerics.HeadDim, 4*numerics.HeadDim, bufferSize(l.NormWeight))
	}
	if !(l.Eps > 0) || math.IsInf(float64(l.Eps), 0) {
		return fmt.Errorf("cuda: compress: Eps = %g must be finite and positive", l.Eps)
	}
	if l.RopePositions < 1 || l.RopePositions > math.MaxInt32 {
		return fmt.Errorf("cuda: compress: RopePositions = %d out of range [1, %d]", l.RopePositions, math.MaxInt32)
	}
	if l.Rope == nil || l.Rope.Len() < l.RopePositions*64*4 {
		return fmt.Errorf("cuda: compress: Rope must hold RopePositions = %d rows of 64 float32 (%d bytes)%s", l.RopePositions, l.RopePositions*64*4, bufferSize(l.Rope))
	}
	if l.PageSize < 1 || l.PageSize > kvcache.MaxPageSize {
		return fmt.Errorf("cuda: compress: PageSize = %d out of range [1, %d]", l.PageSize, kvcache.MaxPageSize)
	}
	if l.NumPages < 1 || l.NumPages > math.MaxInt32 {
		return fmt.Errorf("cuda: compress: NumPages = %d out of range [1, %d]", l.NumPages, math.MaxInt32)
	}
	if want := l.NumPages * kvcache.FormatFP8UE8M0.PageBytes(l.PageSize); l.Pool == nil || l.Pool.Len() < want {
		return fmt.Errorf("cuda: compress: Pool must hold NumPages = %d pages of PageSize = %d entries (%d bytes)%s", l.NumPages, l.PageSize, want, bufferSize(l.Pool))
	}
	return nil
}

func bufferSize(b mla.Buffer) string {
	if b == nil {
		return ", got none"
	}
	return fmt.Sprintf(", got %d bytes", b.Len())
}

// validateJobs checks every job against the layer (which must be valid)
// and returns the total number of candidate codes.
func (l *CompressLayer) validateJobs(jobs []CompressJob) (int, error) {
	type slot struct{ page, off int }
	seen := make(map[slot]int, len(jobs))
	total := 0
	for j := range jobs {
		jb := &jobs[j]
		if jb.Index < 0 || jb.Index >= (l.RopePositions+l.Ratio-1)/l.Ratio {
			return 0, fmt.Errorf("cuda: compress: job %d: Index = %d out of range: entry i is rotated at position i*%d, and the RoPE table has %d positions",
				j, jb.Index, l.Ratio, l.RopePositions)
		}
		if want := CompressCandidates(l.Ratio, jb.Index); len(jb.Candidates) != want {
			return 0, fmt.Errorf("cuda: compress: job %d (entry %d): %d candidates, ratio %d needs %d", j, jb.Index, len(jb.Candidates), l.Ratio, want)
		}
		for k, code := range jb.Candidates {
			if code >= 0 && int(code) >= l.NewRows {
				return 0, fmt.Errorf("cuda: compress: job %d (entry %d): candidate %d is new row %d, but NewRows = %d", j, jb.Index, k, code, l.NewRows)
			}
			if code < 0 && int(^code) >= l.StateRows {
				return 0, fmt.Errorf("cuda: compress: job %d (entry %d): candidate %d is state row %d (code %d), but StateRows = %d", j, jb.Index, k, ^code, code, l.StateRows)
			}
		}
		if jb.Page < 0 || jb.Page >= l.NumPages {
			return 0, fmt.Errorf("cuda: compress: job %d (entry %d): Page = %d out of range [0, %d)", j, jb.Index, jb.Page, l.NumPages)
		}
		if jb.Offset < 0 || jb.Offset >= l.PageSize {
			return 0, fmt.Errorf("cuda: compress: job %d (entry %d): Offset = %d out of range [0, %d)", j, jb.Index, jb.Offset, l.PageSize)
		}
		if prev, dup := seen[slot{jb.Page, jb.Offset}]; dup {
			return 0, fmt.Errorf("cuda: compress: jobs %d and %d both store at page %d offset %d", prev, j, jb.Page, jb.Offset)
		}
		seen[slot{jb.Page, jb.Offset}] = j
		total += len(jb.Candidates)
	}
	if len(jobs) > math.MaxInt32 || total > math.MaxInt32 {
		return 0, fmt.Errorf("cuda: compress: %d jobs with %d candidates exceed the kernel's int32 indices", len(jobs), total)
	}
	return total, nil
}

// packJobs lays the jobs out as the kernel reads them: int32 {index, cand,
// page, off} per job, then every job's candidate codes.
func packJobs(jobs []CompressJob, candidates int) []byte {
	buf := make([]byte, 0, len(jobs)*jobBytes+4*candidates)
	le := binary.LittleEndian
	cand := 0
	for _, jb := range jobs {
		buf = le.AppendUint32(buf, uint32(int32(jb.Index)))
		buf = le.AppendUint32(buf, uint32(int32(cand)))
		buf = le.AppendUint32(buf, uint32(int32(jb.Page)))
		buf = le.AppendUint32(buf, uint32(int32(jb.Offset)))
		cand += len(jb.Candidates)
	}
	for _, jb := range jobs {
		for _, code := range jb.Candidates {
			buf = le.AppendUint32(buf, uint32(code))
		}
	}
	return buf
}

// LoadCompressor compiles (or loads from the cache) the compressor's module
// if it is not loaded yet. CompressEntries and LaunchCompress call it; an
// engine calls it at setup so that no module loads during a graph capture.
func (b *Backend) LoadCompressor() error {
	c := &b.comp
	if c.fn != nil || c.err != nil {
		return c.err
	}
	mod, err := b.load(compressProgram)
	if err != nil {
		c.err = fmt.Errorf("cuda: compressor kernels: %w", err)
		return c.err
	}
	fns := map[string]*driver.Function{}
	for _, name := range abi.CompressKernels {
		if fns[name], err = mod.Function(name); err != nil {
			c.err = errors.Join(fmt.Errorf("cuda: compressor kernels: %w", err), mod.Unload())
			return c.err
		}
	}
	c.mod, c.fn, c.step, c.finish = mod, fns["compress_entries"], fns["compress_step"], fns["compress_step_finish"]
	c.ifinish, c.istep = fns["indexer_step_finish"], fns["indexer_step"]
	c.iquery, c.iqearly, c.iqlean, c.iqwide = fns["indexer_query"], fns["indexer_query_early"], fns["indexer_query_lean"], fns["indexer_query_wide"]
	c.iqstrm, c.iqlane, c.iqtok = fns["indexer_query_stream"], fns["indexer_query_lane"], fns["indexer_query_tok"]
	return nil
}

// CompressEntries computes and stores the entries of jobs (one compressed
// layer, any order, distinct destinations) on the device, bit-identical to
// package compressor (compressor.PoolChannel, then Layer.FinishEntry): it
// checks every field and job (a bad one is refused before anything is
// launched), uploads the job list and launches compress_entries on the
// backend's stream. The upload waits for the stream; for a job list already
// on the device (CUDA graphs), use LaunchCompress.
func (b *Backend) CompressEntries(ctx context.Context, l *CompressLayer, jobs []CompressJob) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.validate(); err != nil {
		return err
	}
	candidates, err := l.validateJobs(jobs)
	if err != nil {
		return err
	}
	if len(jobs) == 0 {
		return nil
	}
	if err := b.LoadCompressor(); err != nil {
		return err
	}
	packed := packJobs(jobs, candidates)
	if b.comp.scratch == nil || b.comp.scratch.Len() < len(packed) {
		if b.comp.scratch != nil {
			if err := b.Free(b.comp.scratch); err != nil {
				return err
			}
			b.comp.scratch = nil
		}
		if b.comp.scratch, err = b.Alloc(max(len(packed), 64<<10)); err != nil {
			return err
		}
	}
	// Write is ordered after the stream's earlier launches, which may still
	// read the previous job list.
	if err := b.Write(b.comp.scratch, 0, packed); err != nil {
		return err
	}
	return b.launchCompress(l, b.comp.scratch, 0, len(jobs), len(jobs)*jobBytes, candidates)
}

// LaunchCompress launches compress_entries over a job list already on the
// device (capturable in a CUDA graph): numJobs jobs of four little-endian
// int32 {index, cand, page, offset} at jobsOff of list, 16-byte aligned,
// and the candidate codes from candsOff to the end of list (a job's codes
// at candsOff + 4*cand), as CompressJob describes them. The host checks
// the layer but not the list's contents: the kernel skips a job whose
// index, page, offset, codes or code range are out of range (writing
// nothing for it).
func (b *Backend) LaunchCompress(ctx context.Context, l *CompressLayer, list mla.Buffer, jobsOff, numJobs, candsOff int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.validate(); err != nil {
		return err
	}
	if numJobs < 0 || numJobs > math.MaxInt32 {
		return fmt.Errorf("cuda: compress: numJobs = %d out of range [0, %d]", numJobs, math.MaxInt32)
	}
	if jobsOff < 0 || jobsOff%jobBytes != 0 {
		return fmt.Errorf("cuda: compress: jobsOff = %d must be a non-negative multiple of %d", jobsOff, jobBytes)
	}
	if candsOff < 0 || candsOff%4 != 0 {
		return fmt.Errorf("cuda: compress: candsOff = %d must be a non-negative multiple of 4", candsOff)
	}
	if _, err := span(list, jobsOff, numJobs*jobBytes); err != nil {
		return fmt.Errorf("cuda: compress: the job list: %w", err)
	}
	if list == nil || candsOff > list.Len() {
		return fmt.Errorf("cuda: compress: candsOff = %d outside the job list's %s", candsOff, strings.TrimPrefix(bufferSize(list), ", got "))
	}
	if numJobs == 0 {
		return nil
	}
	if err := b.LoadCompressor(); err != nil {
		return err
	}
	return b.launchCompress(l, list, jobsOff, numJobs, candsOff, min((list.Len()-candsOff)/4, math.MaxInt32))
}

// launchCompress launches a checked layer's job list.
func (b *Backend) launchCompress(l *CompressLayer, list mla.Buffer, jobsOff, numJobs, candsOff, numCands int) error {
	params, err := compressParams(l, list, jobsOff, numJobs, candsOff, numCands)
	if err != nil {
		return err
	}
	grid := driver.Dim3{b.chainGrid(numJobs), 1, 1}
	return b.launchShared(b.comp.fn, grid, driver.Dim3{compressThreads, 1, 1}, 0, driver.Bytes(params))
}

// compressParams packs compress_entries' CompressParams for a checked
// layer and its job list: numJobs jobs at jobsOff of list, numCands
// candidate codes at candsOff.
func compressParams(l *CompressLayer, list mla.Buffer, jobsOff, numJobs, candsOff, numCands int) ([]byte, error) {
	ptr := func(buf mla.Buffer, rows int) (driver.DevicePtr, error) {
		if rows == 0 {
			return 0, nil
		}
		return span(buf, 0, rows*l.Width()*4)
	}
	newK, err := ptr(l.NewK, l.NewRows)
	if err != nil {
		return nil, err
	}
	newG, err := ptr(l.NewG, l.NewRows)
	if err != nil {
		return nil, err
	}
	stateK, err := ptr(l.StateK, l.StateRows)
	if err != nil {
		return nil, err
	}
	stateG, err := ptr(l.StateG, l.StateRows)
	if err != nil {
		return nil, err
	}
	jobs, err := span(list, jobsOff, numJobs*jobBytes)
	if err != nil {
		return nil, err
	}
	cands, err := span(list, candsOff, 4*numCands)
	if err != nil {
		return nil, err
	}
	norm, err := span(l.NormWeight, 0, 4*numerics.HeadDim)
	if err != nil {
		return nil, err
	}
	rope, err := span(l.Rope, 0, l.RopePositions*64*4)
	if err != nil {
		return nil, err
	}
	pageBytes := kvcache.FormatFP8UE8M0.PageBytes(l.PageSize)
	pool, err := span(l.Pool, 0, l.NumPages*pageBytes)
	if err != nil {
		return nil, err
	}
	p := abi.CompressParams.Pack()
	p.Ptr(abi.CompressNewK, uint64(newK))
	p.Ptr(abi.CompressNewG, uint64(newG))
	p.Ptr(abi.CompressStateK, uint64(stateK))
	p.Ptr(abi.CompressStateG, uint64(stateG))
	p.Ptr(abi.CompressCands, uint64(cands))
	p.Ptr(abi.CompressJobs, uint64(jobs))
	p.Ptr(abi.CompressNorm, uint64(norm))
	p.Ptr(abi.CompressRope, uint64(rope))
	p.Ptr(abi.CompressPool, uint64(pool))
	p.U64(abi.CompressPageBytes, uint64(pageBytes))
	p.I32(abi.CompressNewRows, int32(l.NewRows))
	p.I32(abi.CompressStateRows, int32(l.StateRows))
	p.I32(abi.CompressNumCands, int32(numCands))
	p.I32(abi.CompressNumJobs, int32(numJobs))
	p.I32(abi.CompressRatio, int32(l.Ratio))
	p.I32(abi.CompressWidth, int32(l.Width()))
	p.I32(abi.CompressRopePositions, int32(l.RopePositions))
	p.I32(abi.CompressPageSize, int32(l.PageSize))
	p.I32(abi.CompressNumPages, int32(l.NumPages))
	p.F32(abi.CompressEps, l.Eps)
	return p.Bytes()
}

// closeCompress releases the compressor's module and device buffers.
func (b *Backend) closeCompress() error {
	var errs []error
	free := func(buf mla.Buffer) {
		if db, err := dev(buf); err == nil && db.ptr != 0 {
			errs = append(errs, b.ctx.Free(db.ptr))
			db.ptr, db.n = 0, 0
		}
	}
	if b.comp.scratch != nil {
		free(b.comp.scratch)
	}
	b.comp.scratch = nil
	if b.comp.mod != nil {
		errs = append(errs, b.comp.mod.Unload())
		b.comp.mod, b.comp.fn, b.comp.step, b.comp.finish = nil, nil, nil, nil
		b.comp.ifinish, b.comp.istep, b.comp.iquery, b.comp.iqearly, b.comp.iqlean, b.comp.iqwide, b.comp.iqstrm, b.comp.iqlane, b.comp.iqtok = nil, nil, nil, nil, nil, nil, nil, nil, nil
	}
	return errors.Join(errs...)
}
