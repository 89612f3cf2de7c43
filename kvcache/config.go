package kvcache

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
)

// DefaultPageSize is the page size docs/DESIGN.md calls the default.
const DefaultPageSize = 64

// MaxPageSize bounds Config.PageSize so that page byte sizes stay far from
// overflow.
const MaxPageSize = 1 << 20

// DSv4Window is DeepSeek-V4's sliding window (config sliding_window): a
// query at position t reads raw KV at positions [max(0, t-127), t] only, in
// every layer (docs/DESIGN.md section 8).
const DSv4Window = 128

// Config describes a KV cache pool.
type Config struct {
	// Format is the storage format; the zero value is fp8_ue8m0.
	Format Format
	// PageSize is the number of tokens per page, a power of two.
	PageSize int
	// NumPages is the number of pages in the pool, at least 1.
	NumPages int
	// KVScale is the per-tensor scale of fp8_pertensor (stored value =
	// e4m3(y*KVScale)); it must then be finite and positive. The other
	// formats ignore it.
	KVScale float32
	// Window is the sliding window in tokens: when a reservation commits,
	// every page of a sequence whose positions all lie below
	// committed_len - Window goes back to the pool and its block-table entry
	// becomes -1 (no later query reads it; DESIGN.md section 8). 0 keeps
	// every token for the life of the sequence (DeepSeek-V3's MLA); DSv4
	// uses DSv4Window.
	Window int
}

// Validate reports the first bad field, by name and value.
func (c Config) Validate() error {
	if !c.Format.Valid() {
		return fmt.Errorf("kvcache: Config.Format %d is not a valid format", uint8(c.Format))
	}
	if !isPowerOfTwo(c.PageSize) || c.PageSize > MaxPageSize {
		return fmt.Errorf("kvcache: Config.PageSize %d must be a power of two in [1, %d]", c.PageSize, MaxPageSize)
	}
	if c.NumPages < 1 || c.NumPages > math.MaxInt32 {
		return fmt.Errorf("kvcache: Config.NumPages %d must be in [1, %d]", c.NumPages, math.MaxInt32)
	}
	if hi, lo := bits.Mul64(uint64(c.NumPages), uint64(c.Format.PageBytes(c.PageSize))); hi != 0 || lo > math.MaxInt {
		return fmt.Errorf("kvcache: Config.NumPages %d: the pool of %d-byte pages overflows int",
			c.NumPages, c.Format.PageBytes(c.PageSize))
	}
	if c.Window < 0 || c.Window > math.MaxInt32 {
		return fmt.Errorf("kvcache: Config.Window %d must be in [0, %d] (0 keeps every token)", c.Window, math.MaxInt32)
	}
	if c.Format == FormatFP8PerTensor {
		s := float64(c.KVScale)
		if !(s > 0) || math.IsInf(s, 0) {
			return fmt.Errorf("kvcache: Config.KVScale %v must be finite and positive for format %v", c.KVScale, c.Format)
		}
	}
	return nil
}

// PageBytes returns the bytes of one page, c.Format.PageBytes(c.PageSize).
func (c Config) PageBytes() int { return c.Format.PageBytes(c.PageSize) }

// DeadPages returns how many leading pages of a sequence of committed
// length n the window has freed: those whose positions all lie below
// n - Window (0 when Window is 0).
func (c Config) DeadPages(n int) int {
	if c.Window == 0 || n <= c.Window {
		return 0
	}
	return (n - c.Window) / c.PageSize
}

// LivePages returns the pages a sequence of committed length n holds
// between iterations: ceil(n/PageSize) - DeadPages(n). With a window W it
// never exceeds ceil(W/PageSize) + 1 (3 pages of 64 for DSv4).
func (c Config) LivePages(n int) int {
	if n <= 0 {
		return 0
	}
	pages := n / c.PageSize // not (n+P-1)/P, which overflows near math.MaxInt
	if n%c.PageSize != 0 {
		pages++
	}
	return pages - c.DeadPages(n)
}

// PoolBytes returns the bytes of the whole pool, NumPages*PageBytes.
func (c Config) PoolBytes() int { return c.NumPages * c.PageBytes() }

// ErrSlotOutOfPool reports a slot that does not address a token of the pool.
var ErrSlotOutOfPool = errors.New("kvcache: slot outside the pool")

// SplitSlot returns the page and in-page offset of slot: page = slot >>
// log2(P), off = slot & (P-1). A slot outside [0, NumPages*PageSize) is an
// error wrapping ErrSlotOutOfPool: callers skip negative slots (padding)
// before they get here, so any slot that reaches SplitSlot must be real.
func (c Config) SplitSlot(slot int64) (page int32, off int, err error) {
	if slot < 0 || slot >= int64(c.NumPages)*int64(c.PageSize) {
		return 0, 0, fmt.Errorf("%w: slot %d not in [0, %d)", ErrSlotOutOfPool, slot, int64(c.NumPages)*int64(c.PageSize))
	}
	shift := bits.TrailingZeros(uint(c.PageSize))
	return int32(slot >> shift), int(slot & int64(c.PageSize-1)), nil
}
