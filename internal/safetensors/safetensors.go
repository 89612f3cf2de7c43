package safetensors

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
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
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
	"BF16": 2, "F16": 2, "I16": 2, "U16": 2,
	"F32": 4, "I32": 4, "U32": 4,
	"F64": 8, "I64": 8, "U64": 8, "C64": 8,
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

// WriteFile writes a safetensors file atomically: into path+".tmp", buffered,
// then renamed, so a reader never sees a half-written file.
func WriteFile(path string, tensors []Tensor, meta map[string]string) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	err = Write(w, tensors, meta)
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// Read parses a whole safetensors image (ParseHeader's checks apply);
// tensors come back sorted by name, their Data aliasing data.
func Read(data []byte) ([]Tensor, map[string]string, error) {
	h, err := ParseHeaderBytes(data, int64(len(data)))
	if err != nil {
		return nil, nil, err
	}
	out := make([]Tensor, 0, len(h.Tensors))
	for _, name := range h.Names() {
		t := h.Tensors[name]
		out = append(out, Tensor{Name: name, DType: t.DType, Shape: t.Shape, Data: data[t.Begin:t.End:t.End]})
	}
	return out, h.Metadata, nil
}
