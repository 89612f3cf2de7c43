package safetensors

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	ts := []Tensor{
		{Name: "a", DType: "BF16", Shape: []int{2, 3}, Data: []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}},
		{Name: "b", DType: "I64", Shape: []int{1}, Data: []byte{1, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "s", DType: "F32", Shape: nil, Data: []byte{0, 0, 128, 63}},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, ts, map[string]string{"format": "bf16"}))
	got, meta, err := Read(buf.Bytes())
	require.NoError(t, err)
	require.Equal(t, "bf16", meta["format"])
	byName := map[string]Tensor{}
	for _, g := range got {
		byName[g.Name] = g
	}
	for _, w := range ts {
		require.Equal(t, w.Data, byName[w.Name].Data)
		require.Equal(t, w.DType, byName[w.Name].DType)
	}
}

func TestRefusals(t *testing.T) {
	var buf bytes.Buffer
	require.ErrorContains(t, Write(&buf, []Tensor{{Name: "x", DType: "F32", Shape: []int{2}, Data: []byte{1}}}, nil), "needs 8 bytes")
	require.ErrorContains(t, Write(&buf, []Tensor{{Name: "x", DType: "Q4", Shape: []int{1}, Data: []byte{1}}}, nil), "unknown dtype")
	_, _, err := Read([]byte{1, 2})
	require.Error(t, err)
	_, _, err = Read([]byte{255, 0, 0, 0, 0, 0, 0, 0, '{'})
	require.ErrorContains(t, err, "exceeds")
}
