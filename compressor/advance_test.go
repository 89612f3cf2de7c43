package compressor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAdvanceKeepsWhatAppendKeeps: over random chunks and MTP rollbacks,
// a state moved by Advance holds the same rows, length and window as one
// moved by Append, and Advance's range lists the indices Append emitted.
func TestAdvanceKeepsWhatAppendKeeps(t *testing.T) {
	for _, ratio := range []int{4, 128} {
		t.Run(fmt.Sprintf("r%d", ratio), func(t *testing.T) {
			r := newRand(t)
			l, _ := testLayer(t, r, ratio, 3)
			K, G := randomTokens(r, 700, l.Width())
			app, adv := l.NewState(), l.NewState()
			pos := 0
			for pos < len(K) {
				n := min(len(K)-pos, 1+r.IntN(2*ratio+3))
				entries, err := app.Append(pos, K[pos:pos+n], G[pos:pos+n])
				require.NoError(t, err)
				done, err := adv.Advance(pos, K[pos:pos+n], G[pos:pos+n])
				require.NoError(t, err)
				require.Equal(t, EntryRange{pos / ratio, (pos + n) / ratio}, done)
				require.Len(t, entries, done.Len())
				for k, e := range entries {
					require.Equal(t, done.Begin+k, e.Index)
				}
				pos += n
				if n <= 3 && r.IntN(2) == 0 { // roll back some drafts
					back := r.IntN(n + 1)
					d1, err := app.Accept(pos - back)
					require.NoError(t, err)
					d2, err := adv.Accept(pos - back)
					require.NoError(t, err)
					require.Equal(t, d1, d2)
					pos -= back
				}
				require.Equal(t, app.Len(), adv.Len())
				f1, e1 := app.Window()
				f2, e2 := adv.Window()
				require.Equal(t, [2]int{f1, e1}, [2]int{f2, e2})
				for p := max(0, pos-l.StateRows()); p < pos; p++ {
					k1, g1, ok1 := app.Row(p)
					k2, g2, ok2 := adv.Row(p)
					require.Equal(t, ok1, ok2, "position %d", p)
					require.Equal(t, k1, k2, "position %d", p)
					require.Equal(t, g1, g2, "position %d", p)
				}
			}
		})
	}
}

// TestAdvanceRefuses: Append's refusals, and an entry past the RoPE
// table, leave the state as it was.
func TestAdvanceRefuses(t *testing.T) {
	r := newRand(t)
	l, _ := testLayer(t, r, 128, 0)
	K, G := randomTokens(r, tablePositions+128, l.Width())
	s := l.NewState()
	_, err := s.Advance(1, K[:1], G[:1])
	require.ErrorContains(t, err, "Append at position 1")
	_, err = s.Advance(0, K[:2], G[:1])
	require.ErrorContains(t, err, "2 K rows but 1 G rows")
	_, err = s.Advance(0, [][]float32{K[0][:5]}, G[:1])
	require.ErrorContains(t, err, "K has 5 values")
	_, err = s.Advance(0, K, G)
	require.ErrorContains(t, err, fmt.Sprintf("entry %d", tablePositions/128))
	require.Zero(t, s.Len())
	done, err := s.Advance(0, nil, nil)
	require.NoError(t, err)
	require.Zero(t, done.Len())
}
