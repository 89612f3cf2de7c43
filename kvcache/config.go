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
