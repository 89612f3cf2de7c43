package safetensors

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// image builds a file from a literal header and n data bytes 0, 1, 2, ...
func image(header string, n int) []byte {
	var b bytes.Buffer
	var l [8]byte
	binary.LittleEndian.PutUint64(l[:], uint64(len(header)))
	b.Write(l[:])
	b.WriteString(header)
	for i := range n {
		b.WriteByte(byte(i))
	}
	return b.Bytes()
}

func TestParseHeaderRanged(t *testing.T) {
	ts := []Tensor{
		{Name: "w", DType: "F8_E4M3", Shape: []int{3, 4}, Data: []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
		{Name: "s", DType: "F8_E8M0", Shape: []int{1, 1}, Data: []byte{127}},
		{Name: "v", DType: "F32", Shape: []int{2}, Data: []byte{0, 0, 128, 63, 0, 0, 0, 64}},
	}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, ts, map[string]string{"k": "v"}))
	data := buf.Bytes()
	h, err := ParseHeader(bytes.NewReader(data), int64(len(data)))
	require.NoError(t, err)
	require.Equal(t, []string{"s", "v", "w"}, h.Names())
	require.Equal(t, "v", h.Metadata["k"])
	w := h.Tensors["w"]
	require.Equal(t, int64(4), w.RowBytes())
	rows := make([]byte, 8)
	require.NoError(t, w.ReadRows(bytes.NewReader(data), rows, 1, 3))
	require.Equal(t, []byte{4, 5, 6, 7, 8, 9, 10, 11}, rows)
	require.ErrorContains(t, w.ReadRows(bytes.NewReader(data), rows, 2, 4), "outside [0, 3)")
	require.ErrorContains(t, w.ReadRows(bytes.NewReader(data), rows[:3], 0, 1), "buffer has 3")

	// A file cut after its header: the header is refused (offsets past the end).
	_, err = ParseHeader(bytes.NewReader(data[:len(data)-1]), int64(len(data)-1))
	require.ErrorContains(t, err, "reach past")
	// A reader that is shorter than the size it claims: ReadRows reports it.
	short := bytes.NewReader(data[:len(data)-2])
	require.ErrorContains(t, h.Tensors["v"].ReadRows(short, rows, 0, 2), "truncated")
}

func TestParseHeaderRefusals(t *testing.T) {
	cases := []struct {
		name   string
		header string
		data   int
		want   string
	}{
		{"not an object", `[1]`, 0, "not a JSON object"},
		{"bad json", `{"a":`, 0, "header"},
		{"trailing", `{} {}`, 0, "trailing"},
		{"duplicate", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, 2, `"a" appears twice`},
		{"no dtype", `{"a":{"shape":[1],"data_offsets":[0,1]}}`, 1, "no dtype"},
		{"no shape", `{"a":{"dtype":"U8","data_offsets":[0,1]}}`, 1, "no shape"},
		{"offsets arity", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}`, 1, "has 1 entries"},
		{"negative dim", `{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1, "shape[0] = -1"},
		{"fractional dim", `{"a":{"dtype":"U8","shape":[1.5],"data_offsets":[0,1]}}`, 1, "shape[0] = 1.5"},
		{"huge dim", `{"a":{"dtype":"U8","shape":[99999999999],"data_offsets":[0,1]}}`, 1, "shape[0] = 99999999999"},
		{"negative offset", `{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}`, 1, "data_offsets[0] = -1"},
		{"reversed", `{"a":{"dtype":"U8","shape":[0],"data_offsets":[1,0]}}`, 1, "reversed"},
		{"past end", `{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}`, 3, "reach past"},
		{"size lie", `{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 4, "the shape needs 8"},
		{"shape overflow", `{"a":{"dtype":"F32","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,4]}}`, 4, "more than the 4 data bytes"},
		{"overlap", `{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}`, 3, "overlap"},
		{"metadata not strings", `{"__metadata__":{"a":1}}`, 0, "__metadata__"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			img := image(c.header, c.data)
			h, err := ParseHeader(bytes.NewReader(img), int64(len(img)))
			require.ErrorContains(t, err, c.want)
			require.Nil(t, h)
		})
	}
}

func TestParseHeaderAccepts(t *testing.T) {
	// Unknown dtypes are kept (a shard may hold types this package cannot
	// size), zero-size tensors may share an offset, gaps are allowed.
	img := image(`{"f4":{"dtype":"F4","shape":[3],"data_offsets":[0,2]},"e":{"dtype":"F32","shape":[0,7],"data_offsets":[2,2]},"b":{"dtype":"U8","shape":[],"data_offsets":[3,4]}}`, 4)
	h, err := ParseHeader(bytes.NewReader(img), int64(len(img)))
	require.NoError(t, err)
	require.Equal(t, 0, h.Tensors["f4"].ElemSize)
	require.ErrorContains(t, h.Tensors["f4"].ReadRows(bytes.NewReader(img), nil, 0, 1), "unknown size")
	one := make([]byte, 1)
	require.NoError(t, h.Tensors["b"].ReadRows(bytes.NewReader(img), one, 0, 1))
	require.Equal(t, byte(3), one[0])
}

// hugeLen claims a header length beyond MaxHeaderBytes in a file that is
// (said to be) large enough: refused before allocating.
type hugeLen struct{}

func (hugeLen) ReadAt(p []byte, off int64) (int, error) {
	if off != 0 || len(p) != 8 {
		return 0, io.EOF
	}
	binary.LittleEndian.PutUint64(p, 1<<40)
	return 8, nil
}

func TestParseHeaderLengthLimits(t *testing.T) {
	_, err := ParseHeader(hugeLen{}, 1<<41)
	require.ErrorContains(t, err, "limit")
	_, err = ParseHeader(hugeLen{}, 100)
	require.ErrorContains(t, err, "exceeds the file")
	_, err = ParseHeader(bytes.NewReader([]byte{1}), 1)
	require.ErrorContains(t, err, "shorter")
}

func FuzzParseHeader(f *testing.F) {
	var buf bytes.Buffer
	_ = Write(&buf, []Tensor{
		{Name: "w", DType: "F8_E4M3", Shape: []int{2, 2}, Data: []byte{1, 2, 3, 4}},
		{Name: "s", DType: "F32", Shape: []int{1}, Data: []byte{0, 0, 128, 63}},
	}, map[string]string{"format": "pt"})
	f.Add(buf.Bytes())
	f.Add(image(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 2))
	f.Add(image(`{"a":{"dtype":"F4","shape":[2147483647,9],"data_offsets":[0,1]}}`, 1))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHeader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			require.Nil(t, h)
			return
		}
		// Every accepted tensor lies inside the data region, sized as its
		// shape says, and its rows can be read back.
		for _, ti := range h.Tensors {
			require.True(t, h.DataStart <= ti.Begin && ti.Begin <= ti.End && ti.End <= int64(len(data)), "%+v", ti)
			if ti.ElemSize == 0 {
				continue
			}
			rows := 1
			if len(ti.Shape) > 0 {
				rows = ti.Shape[0]
			}
			if rows == 0 {
				continue
			}
			require.Equal(t, ti.End-ti.Begin, ti.RowBytes()*int64(rows))
			dst := make([]byte, ti.RowBytes())
			require.NoError(t, ti.ReadRows(bytes.NewReader(data), dst, rows-1, rows))
		}
	})
}
