package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// MaxHeaderBytes bounds the JSON header a reader accepts (the limit the
// reference safetensors implementation applies too), so that a corrupt
// length prefix cannot make ParseHeader allocate gigabytes.
const MaxHeaderBytes = 100 << 20

// TensorInfo locates one tensor of a parsed header. Begin and End are
// absolute byte offsets in the file. ElemSize is 0 for a dtype this package
// does not know (e.g. sub-byte types): such a tensor is kept, with its bytes
// inside the data region, but its shape is not checked against its size.
type TensorInfo struct {
	Name     string
	DType    string
	Shape    []int
	Begin    int64
	End      int64
	ElemSize int
}

// Header is a parsed safetensors header.
type Header struct {
	Tensors   map[string]TensorInfo
	Metadata  map[string]string
	DataStart int64 // file offset of the data region: 8 + header length
	FileSize  int64
}

// Names returns the tensor names, sorted.
func (h *Header) Names() []string {
	names := make([]string, 0, len(h.Tensors))
	for n := range h.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ParseHeader reads and checks the header of a safetensors file of fileSize
// bytes without reading its data. It refuses a header length beyond the file
// or MaxHeaderBytes, malformed JSON, a duplicate name, a negative dimension,
// offsets that are reversed, overlap another tensor's or reach past the end
// of the file (a truncated file), and a known dtype whose shape does not
// match its byte count.
func ParseHeader(r io.ReaderAt, fileSize int64) (*Header, error) {
	if fileSize < 8 {
		return nil, fmt.Errorf("safetensors: file of %d bytes is shorter than its 8-byte header length", fileSize)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: reading the header length: %w", err)
	}
	hl := binary.LittleEndian.Uint64(lenBuf[:])
	if hl > uint64(fileSize-8) {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the file (%d bytes)", hl, fileSize)
	}
	if hl > MaxHeaderBytes {
		return nil, fmt.Errorf("safetensors: header length %d exceeds the %d-byte limit", hl, MaxHeaderBytes)
	}
	buf := make([]byte, hl)
	if _, err := r.ReadAt(buf, 8); err != nil {
		return nil, fmt.Errorf("safetensors: reading the %d-byte header: %w", hl, err)
	}
	return parseHeaderJSON(buf, fileSize)
}

// ParseHeaderBytes is ParseHeader over an in-memory prefix of a file of
// fileSize bytes (the prefix must hold at least the whole header).
func ParseHeaderBytes(data []byte, fileSize int64) (*Header, error) {
	return ParseHeader(bytes.NewReader(data), max(fileSize, int64(len(data))))
}

func parseHeaderJSON(buf []byte, fileSize int64) (*Header, error) {
	h := &Header{Tensors: map[string]TensorInfo{}, DataStart: 8 + int64(len(buf)), FileSize: fileSize}
	dataLen := fileSize - h.DataStart

	dec := json.NewDecoder(bytes.NewReader(buf))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("safetensors: header is not a JSON object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("safetensors: header: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("safetensors: header: key %v is not a string", tok)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("safetensors: header: value of %q: %w", name, err)
		}
		if name == "__metadata__" {
			if h.Metadata != nil {
				return nil, errors.New("safetensors: header: duplicate __metadata__")
			}
			if err := json.Unmarshal(raw, &h.Metadata); err != nil {
				return nil, fmt.Errorf("safetensors: __metadata__ must map strings to strings: %w", err)
			}
			if h.Metadata == nil {
				h.Metadata = map[string]string{}
			}
			continue
		}
		if _, dup := h.Tensors[name]; dup {
			return nil, fmt.Errorf("safetensors: tensor %q appears twice in the header", name)
		}
		t, err := parseEntry(name, raw, dataLen)
		if err != nil {
			return nil, err
		}
		t.Begin += h.DataStart
		t.End += h.DataStart
		h.Tensors[name] = t
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	if dec.More() {
		return nil, errors.New("safetensors: header: trailing data after the JSON object")
	}
	if err := checkOverlap(h); err != nil {
		return nil, err
	}
	return h, nil
}

// rawEntry uses json.Number so that fractional, huge or negative values are
// refused by name instead of silently truncated.
type rawEntry struct {
	DType   *string       `json:"dtype"`
	Shape   []json.Number `json:"shape"`
	Offsets []json.Number `json:"data_offsets"`
}

func parseEntry(name string, raw json.RawMessage, dataLen int64) (TensorInfo, error) {
	var e rawEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: malformed entry: %w", name, err)
	}
	if e.DType == nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q has no dtype", name)
	}
	if e.Shape == nil {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q has no shape", name)
	}
	if len(e.Offsets) != 2 {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets has %d entries, want 2", name, len(e.Offsets))
	}
	t := TensorInfo{Name: name, DType: *e.DType, Shape: make([]int, len(e.Shape)), ElemSize: dtypeSize[*e.DType]}
	// Elements counted with overflow checks: a count past the data region is
	// already wrong, so the product saturates at dataLen+1.
	elems, zero := int64(1), false
	for i, d := range e.Shape {
		v, err := d.Int64()
		if err != nil || v < 0 || v > math.MaxInt32 {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: shape[%d] = %s is not a dimension in [0, 2^31)", name, i, d)
		}
		t.Shape[i] = int(v)
		switch {
		case v == 0:
			zero = true
		case elems > dataLen/v:
			elems = dataLen + 1
		default:
			elems *= v
		}
	}
	if zero {
		elems = 0
	}
	var off [2]int64
	for i, o := range e.Offsets {
		v, err := o.Int64()
		if err != nil || v < 0 {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets[%d] = %s is not a non-negative integer", name, i, o)
		}
		off[i] = v
	}
	if off[1] < off[0] {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] are reversed", name, off[0], off[1])
	}
	if off[1] > dataLen {
		return TensorInfo{}, fmt.Errorf("safetensors: tensor %q: data_offsets [%d, %d] reach past the %d data bytes (file truncated or header wrong)", name, off[0], off[1], dataLen)
	}
	if t.ElemSize > 0 {
		if elems > dataLen {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q %s%v: the shape needs more than the %d data bytes", name, t.DType, t.Shape, dataLen)
		}
		if elems*int64(t.ElemSize) != off[1]-off[0] {
			return TensorInfo{}, fmt.Errorf("safetensors: tensor %q %s%v: data_offsets [%d, %d] hold %d bytes, the shape needs %d",
				name, t.DType, t.Shape, off[0], off[1], off[1]-off[0], elems*int64(t.ElemSize))
		}
	}
	t.Begin, t.End = off[0], off[1]
	return t, nil
}

func checkOverlap(h *Header) error {
	ts := make([]TensorInfo, 0, len(h.Tensors))
	for _, t := range h.Tensors {
		if t.End > t.Begin {
			ts = append(ts, t)
		}
	}
	sort.Slice(ts, func(i, j int) bool {
		if ts[i].Begin != ts[j].Begin {
			return ts[i].Begin < ts[j].Begin
		}
		return ts[i].Name < ts[j].Name
	})
	for i := 1; i < len(ts); i++ {
		if ts[i].Begin < ts[i-1].End {
			return fmt.Errorf("safetensors: tensors %q [%d, %d) and %q [%d, %d) overlap",
				ts[i-1].Name, ts[i-1].Begin-h.DataStart, ts[i-1].End-h.DataStart, ts[i].Name, ts[i].Begin-h.DataStart, ts[i].End-h.DataStart)
		}
	}
	return nil
}

// RowBytes is the byte size of one slice along dimension 0 (the product of
// the other dimensions times the element size); 0 for an unknown dtype.
func (t TensorInfo) RowBytes() int64 {
	n := int64(t.ElemSize)
	for _, d := range t.Shape[min(1, len(t.Shape)):] {
		n *= int64(d)
	}
	return n
}

// ReadRows reads rows [row0, row1) along dimension 0 of t into dst, which
// must be exactly that many bytes. It reads only those bytes (one ReadAt).
func (t TensorInfo) ReadRows(r io.ReaderAt, dst []byte, row0, row1 int) error {
	if t.ElemSize == 0 {
		return fmt.Errorf("safetensors: tensor %q has dtype %q of unknown size", t.Name, t.DType)
	}
	if len(t.Shape) == 0 {
		if row0 != 0 || row1 != 1 {
			return fmt.Errorf("safetensors: tensor %q is a scalar: only row range [0, 1) exists", t.Name)
		}
	} else if row0 < 0 || row1 < row0 || row1 > t.Shape[0] {
		return fmt.Errorf("safetensors: tensor %q: row range [%d, %d) outside [0, %d)", t.Name, row0, row1, t.Shape[0])
	}
	rb := t.RowBytes()
	want := rb * int64(row1-row0)
	if int64(len(dst)) != want {
		return fmt.Errorf("safetensors: tensor %q: rows [%d, %d) are %d bytes, buffer has %d", t.Name, row0, row1, want, len(dst))
	}
	if want == 0 {
		return nil
	}
	n, err := r.ReadAt(dst, t.Begin+rb*int64(row0))
	if n == len(dst) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("safetensors: tensor %q: reading %d bytes at offset %d: %w (file truncated?)", t.Name, want, t.Begin+rb*int64(row0), err)
}
