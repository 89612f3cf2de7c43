// Package safetensors writes the safetensors format (an 8-byte little-endian
// header length, a JSON header of dtype, shape and data offsets per tensor
// plus a __metadata__ map of strings, then the raw bytes), so dumps can be
// checked with PyTorch. It also reads it back, for tests.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
)

// Tensor is one named tensor: its dtype (safetensors names: "BF16", "F32",
// "I32", "I64", "U8", "F8_E4M3", ...), shape and little-endian bytes.
type Tensor struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
}

var dtypeSize = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
	"BF16": 2, "F16": 2, "I16": 2, "U16": 2,
	"F32": 4, "I32": 4, "U32": 4,
	"F64": 8, "I64": 8, "U64": 8,
}

type entry struct {
	DType   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// Write writes the tensors (in the given order) and metadata to w.
func Write(w io.Writer, tensors []Tensor, meta map[string]string) error {
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	off := 0
	for _, t := range tensors {
		size, ok := dtypeSize[t.DType]
		if !ok {
			return fmt.Errorf("safetensors: tensor %q has unknown dtype %q", t.Name, t.DType)
		}
		n := size
		for _, d := range t.Shape {
			n *= d
		}
		if n != len(t.Data) {
			return fmt.Errorf("safetensors: tensor %q %s%v needs %d bytes, has %d", t.Name, t.DType, t.Shape, n, len(t.Data))
		}
		if _, dup := header[t.Name]; dup || t.Name == "__metadata__" {
			return fmt.Errorf("safetensors: duplicate or reserved tensor name %q", t.Name)
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = entry{DType: t.DType, Shape: shape, Offsets: [2]int{off, off + n}}
		off += n
	}
	h, err := json.Marshal(header)
	if err != nil {
		return err
	}
	// Pad the header with spaces so the data starts 8-byte aligned.
	for len(h)%8 != 0 {
		h = append(h, ' ')
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(h)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(h); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes a safetensors file atomically.
func WriteFile(path string, tensors []Tensor, meta map[string]string) error {
	var buf bytes.Buffer
	if err := Write(&buf, tensors, meta); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Read parses a safetensors image; tensors come back sorted by name.
func Read(data []byte) ([]Tensor, map[string]string, error) {
	if len(data) < 8 {
		return nil, nil, errors.New("safetensors: shorter than its header length")
	}
	hl := binary.LittleEndian.Uint64(data)
	if hl > uint64(len(data)-8) {
		return nil, nil, fmt.Errorf("safetensors: header length %d exceeds the file", hl)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data[8:8+hl], &raw); err != nil {
		return nil, nil, fmt.Errorf("safetensors: header: %w", err)
	}
	body := data[8+hl:]
	var meta map[string]string
	var out []Tensor
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, fmt.Errorf("safetensors: __metadata__: %w", err)
			}
			continue
		}
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, fmt.Errorf("safetensors: tensor %q: %w", name, err)
		}
		if e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > len(body) {
			return nil, nil, fmt.Errorf("safetensors: tensor %q offsets %v outside %d data bytes", name, e.Offsets, len(body))
		}
		out = append(out, Tensor{Name: name, DType: e.DType, Shape: e.Shape, Data: body[e.Offsets[0]:e.Offsets[1]]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, meta, nil
}
