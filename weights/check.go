package weights

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"

	"github.com/dsv4mla/prologue/internal/regularfile"
	"github.com/dsv4mla/prologue/model/dsv4"
)

// Sentinel errors of the value checks; a *TensorError wraps them.
var (
	// ErrNonFinite is a NaN or an infinity in a weight: a float32 or bf16
	// value, or an e4m3 byte 0x7F or 0xFF (e4m3fn's NaNs; it has no
	// infinity). One such value poisons every output it reaches (a NaN
	// q_norm weight gives a NaN Q row; an infinite weight saturates its
	// activation group's scale and zeroes the others).
	ErrNonFinite = errors.New("not a finite value")
	// ErrBadScale is an FP8 block scale that is not finite and positive
	// (a float32 NaN, infinity, zero or negative value, or the e8m0 NaN
	// byte 0xFF): the block's weights would dequantize to NaN or zero.
	ErrBadScale = errors.New("not a finite positive block scale")
	// ErrNotRegular is a checkpoint file that is not a regular file (a
	// FIFO, a device, a directory): reading one could block or never end.
	// Every file is opened through regularfile.Open, which checks before
	// and after a non-blocking open, so a FIFO never blocks a load. It is
	// dsv4's too, which refuses a config.json the same way. Symbolic
	// links are followed wherever they point: HuggingFace's hub cache
	// keeps a snapshot as links into ../../blobs/, outside the snapshot
	// directory. The index's own file names must still be local
	// (ParseIndex); what a link in the directory points at is the
	// directory owner's choice, and only its target's kind is checked.
	ErrNotRegular = regularfile.ErrNotRegular
)

// CheckFinite returns an error wrapping ErrNonFinite that names the
// weight and the index of its first NaN or infinite value, or nil. The
// loader applies the same check to every float it loads; the engine applies
// it to the weights a caller sets directly.
func CheckFinite(name string, v []float32) error {
	if i, x, ok := firstNonFinite(v); ok {
		return fmt.Errorf("weights: %s: element %d is %v: %w", name, i, x, ErrNonFinite)
	}
	return nil
}

func firstNonFinite(v []float32) (int, float32, bool) {
	for i, x := range v {
		if math.Float32bits(x)&0x7F800000 == 0x7F800000 {
			return i, x, true
		}
	}
	return 0, 0, false
}

// firstNonFiniteBF16 finds the first bf16 NaN or infinity (all exponent
// bits set).
func firstNonFiniteBF16(v []uint16) (int, bool) {
	for i, u := range v {
		if u&0x7F80 == 0x7F80 {
			return i, true
		}
	}
	return 0, false
}

// firstE4M3NaN finds the first e4m3fn NaN byte, 0x7F or 0xFF.
func firstE4M3NaN(b []byte) (int, bool) {
	i, j := bytes.IndexByte(b, 0x7F), bytes.IndexByte(b, 0xFF)
	switch {
	case i < 0 && j < 0:
		return 0, false
	case i < 0:
		return j, true
	case j < 0:
		return i, true
	}
	return min(i, j), true
}

// readConfig reads and parses dir's config.json (dsv4.Load never blocks on
// a FIFO either).
func readConfig(dir string) (dsv4.Config, error) {
	c, err := dsv4.Load(filepath.Join(dir, ConfigFile))
	if err != nil {
		return dsv4.Config{}, fmt.Errorf("weights: %w", err)
	}
	return c, nil
}

// CheckConfig refuses a model config that disagrees with the checkpoint
// directory's config.json, the checkpoint's truth: the error names every
// field that differs (wrapping dsv4.ErrMismatch), or says why config.json
// cannot be read. A command that takes both a --model and a checkpoint
// calls it before anything else reads the checkpoint.
func CheckConfig(dir string, model dsv4.Config) error {
	ck, err := readConfig(dir)
	if err != nil {
		return err
	}
	if err := dsv4.Diff(model, ck); err != nil {
		return fmt.Errorf("weights: %s disagrees with the model config given (given vs config.json): %w", filepath.Join(dir, ConfigFile), err)
	}
	return nil
}
