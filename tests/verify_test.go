package tests

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/engine"
	"github.com/dsv4mla/prologue/engine/replay"
	"github.com/dsv4mla/prologue/engine/trace"
	"github.com/dsv4mla/prologue/metadata"
)

// corrupting is the cpu backend with one deliberate fault: after its
// target-th launch of one kernel it flips one bit of one byte that launch
// wrote, as a broken GPU kernel would. It records what it flipped.
type corrupting struct {
	*cpu.Backend
	kernel string // "q" or "kv"
	target int
	rng    *rand.Rand

	launches int
	flipped  bool
	qOffset  int   // byte flipped in the Q output buffer
	page     int32 // page flipped in the cache pool
	inPage   int   // byte flipped in that page
	mask     byte
}

func (c *corrupting) Name() string { return "corrupt-" + c.kernel }

func (c *corrupting) QNormRopeQuant(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := c.Backend.QNormRopeQuant(ctx, l, a); err != nil || c.kernel != "q" {
		return err
	}
	if c.launches++; c.launches-1 == c.target {
		row := a.Heads * 512 * a.QFormat.ElemBytes()
		c.qOffset = l.RowBegin*row + c.rng.IntN(l.ValidRows*row)
		c.mask = byte(1 << c.rng.IntN(8))
		cpu.Bytes(a.QOut)[c.qOffset] ^= c.mask
		c.flipped = true
	}
	return nil
}

func (c *corrupting) KVNormRopeStore(ctx context.Context, l mla.Launch, a *mla.LayerArgs) error {
	if err := c.Backend.KVNormRopeStore(ctx, l, a); err != nil || c.kernel != "kv" {
		return err
	}
	if c.launches++; c.launches-1 != c.target {
		return nil
	}
	// The launch's first row: its sequence's first new position.
	meta, mb := cpu.Bytes(a.Meta.Buf), a.Meta
	at := func(off, i int) int { return int(int32(binary.LittleEndian.Uint32(meta[off+4*i:]))) }
	b := l.SeqBegin
	pos := at(mb.OffCached, b)
	if l.Phase == metadata.Generation {
		pos = at(mb.OffKVLen, b) - l.SeqLen
	}
	cc := a.CacheConfig
	c.page = int32(at(mb.OffBlockTables, b*mb.PageStride+pos>>bits.TrailingZeros(uint(cc.PageSize))))
	c.inPage = cc.Format.ValueOffset(cc.PageSize, pos&(cc.PageSize-1)) + c.rng.IntN(448)
	c.mask = byte(1 << c.rng.IntN(8))
	cpu.Bytes(a.Cache)[int(c.page)*cc.PageBytes()+c.inPage] ^= c.mask
	c.flipped = true
	return nil
}

// The backend the test opened last, per kernel.
var corrupted struct {
	sync.Mutex
	last   map[string]*corrupting
	target int
	seed   uint64
}

func init() {
	corrupted.last = map[string]*corrupting{}
	for _, kernel := range []string{"q", "kv"} {
		engine.RegisterBackend("corrupt-"+kernel, func(engine.Options) (mla.Backend, error) {
			corrupted.Lock()
			defer corrupted.Unlock()
			c := &corrupting{Backend: cpu.New(0), kernel: kernel, target: corrupted.target, rng: rand.New(rand.NewPCG(corrupted.seed, uint64(corrupted.target)<<8|uint64(len(kernel))))}
			corrupted.last[kernel] = c
			return c, nil
		}, func() error { return nil })
	}
}

const verifyTrace = `# three iterations: context, mixed, generation
{"context":[{"seq":1,"tokens":70},{"seq":2,"tokens":9}]}
{"context":[{"seq":1,"tokens":30}],"generation":{"mtp":3,"seqs":[2]}}
{"generation":{"mtp":3,"seqs":[1,2]},"finish":[1,2]}
`

// TestVerifyReportsACorruptedByte flips one bit in what one launch wrote
// (a Q output byte, or a cache byte) and checks that --verify's comparison
// stops at exactly that byte, naming the iteration, layer and trace line.
func TestVerifyReportsACorruptedByte(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	steps, err := trace.Parse(strings.NewReader(verifyTrace))
	require.NoError(t, err)
	for _, c := range []struct {
		kernel          string
		target          int // launch of that kernel to corrupt, counting every layer
		iteration, line int
		layer           int
	}{
		// 2 layers; iteration 0 has one context launch per layer (0, 1),
		// iteration 1 a context and a generation launch per layer (2-5).
		{"q", 1, 0, 2, 1},
		{"q", 3, 1, 3, 0},
		{"kv", 0, 0, 2, 0},
		{"kv", 5, 1, 3, 1},
	} {
		corrupted.Lock()
		corrupted.target, corrupted.seed = c.target, seed
		corrupted.Unlock()
		opts := replayOptions(t, steps, 16)
		opts.Engine.Backend = "corrupt-" + c.kernel
		opts.Verify = true
		r, err := replay.New(context.Background(), opts)
		require.NoError(t, err)
		rep, err := r.Run(context.Background(), steps, nil)
		require.NoError(t, r.Close())
		require.Error(t, err, "%+v: the corrupted byte went unnoticed", c)
		t.Logf("%+v: %v", c, err)

		corrupted.Lock()
		fault := corrupted.last[c.kernel]
		corrupted.Unlock()
		require.True(t, fault.flipped)
		var le *trace.LineError
		require.ErrorAs(t, err, &le)
		require.Equal(t, c.line, le.Line)
		var ve *replay.VerifyError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, c.iteration, ve.Iteration)
		require.Equal(t, c.layer, ve.Layer)
		require.Equal(t, "corrupt-"+c.kernel, ve.Backend)
		require.Equal(t, 1, ve.Differ, "one byte differs")
		require.Equal(t, ve.Want[0]^fault.mask, ve.Got[0])
		require.Equal(t, ve.Want[1:], ve.Got[1:])
		if c.kernel == "q" {
			require.Equal(t, "Q output", ve.Buffer)
			require.Equal(t, fault.qOffset, ve.Offset)
		} else {
			require.Equal(t, fmt.Sprintf("cache page %d", fault.page), ve.Buffer)
			require.Equal(t, fault.inPage, ve.Offset)
			require.Contains(t, ve.Where, "e4m3 nope value")
		}
		require.Len(t, rep.Iterations, c.iteration, "the replay stops at the failing line")
	}
}
