package weights

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/dsv4mla/prologue/internal/regularfile"
	"github.com/dsv4mla/prologue/internal/safetensors"
)

// File names of a checkpoint directory.
const (
	IndexFile  = "model.safetensors.index.json" // tensor name -> shard file
	ConfigFile = "config.json"
	// SingleFile is read in place of an index when a checkpoint has one
	// unsharded file and no index.
	SingleFile = "model.safetensors"
)

// maxIndexBytes bounds the index file read into memory. V4-Flash's index,
// every expert's tensors included, is a few MB.
const maxIndexBytes = 256 << 20

// Index is a parsed model.safetensors.index.json: which shard file holds each
// tensor. File names are relative to the checkpoint directory and local (no
// absolute path, no "..").
type Index struct {
	WeightMap map[string]string
}

// Files returns the distinct shard files, sorted.
func (x *Index) Files() []string {
	seen := map[string]bool{}
	var out []string
	for _, f := range x.WeightMap {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// ParseIndex parses an index file: a JSON object whose "weight_map" maps
// tensor names to shard file names ("metadata" and other keys are ignored).
// It refuses a missing or malformed weight_map, a top-level key given twice
// (two weight_maps: which one is the checkpoint?), a tensor listed twice, an
// empty name, and a file name that is not a local path.
func ParseIndex(data []byte) (*Index, error) {
	top, err := topLevel(data)
	if err != nil {
		return nil, err
	}
	raw, ok := top["weight_map"]
	if !ok {
		return nil, errors.New(`weights: index has no "weight_map"`)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New(`weights: index "weight_map" is not a JSON object`)
	}
	x := &Index{WeightMap: map[string]string{}}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("weights: index weight_map: %w", err)
		}
		name, _ := tok.(string)
		var file string
		if err := dec.Decode(&file); err != nil {
			return nil, fmt.Errorf("weights: index weight_map[%q]: the file must be a string: %w", name, err)
		}
		switch {
		case name == "":
			return nil, errors.New("weights: index weight_map has an empty tensor name")
		case !filepath.IsLocal(file):
			return nil, fmt.Errorf("weights: index weight_map[%q] = %q: not a file name inside the checkpoint directory", name, file)
		}
		if _, dup := x.WeightMap[name]; dup {
			return nil, fmt.Errorf("weights: index weight_map lists tensor %q twice", name)
		}
		x.WeightMap[name] = file
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("weights: index weight_map: %w", err)
	}
	return x, nil
}

// topLevel splits a JSON object into its values by key, refusing a key
// given twice (encoding/json would silently keep the last).
func topLevel(data []byte) (map[string]json.RawMessage, error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal(data, &probe); err != nil || probe == nil {
		if err == nil {
			err = errors.New("found null")
		}
		return nil, fmt.Errorf("weights: index is not a JSON object: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // '{', checked by Unmarshal
		return nil, fmt.Errorf("weights: index: %w", err)
	}
	top := map[string]json.RawMessage{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("weights: index: %w", err)
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("weights: index: %w", err)
		}
		if _, dup := top[key]; dup {
			return nil, fmt.Errorf("weights: index has the key %q twice", key)
		}
		top[key] = v
	}
	return top, nil
}

// ReadIndex reads dir's index file; without one, a lone model.safetensors
// is indexed from its header.
func ReadIndex(dir string) (*Index, error) {
	path := filepath.Join(dir, IndexFile)
	f, _, err := regularfile.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		x, serr := singleFileIndex(dir)
		if errors.Is(serr, os.ErrNotExist) {
			return nil, fmt.Errorf("weights: %s: no %s (and no single %s)", dir, IndexFile, SingleFile)
		}
		if serr != nil {
			return nil, fmt.Errorf("weights: %s: %w", filepath.Join(dir, SingleFile), serr)
		}
		return x, nil
	}
	if err != nil {
		return nil, fmt.Errorf("weights: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxIndexBytes+1))
	if err != nil {
		return nil, fmt.Errorf("weights: %s: %w", path, err)
	}
	if len(data) > maxIndexBytes {
		return nil, fmt.Errorf("weights: %s: larger than the %d-byte limit", path, maxIndexBytes)
	}
	x, err := ParseIndex(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

func singleFileIndex(dir string) (*Index, error) {
	f, st, err := regularfile.Open(filepath.Join(dir, SingleFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h, err := safetensors.ParseHeader(f, st.Size())
	if err != nil {
		return nil, err
	}
	x := &Index{WeightMap: map[string]string{}}
	for name := range h.Tensors {
		x.WeightMap[name] = SingleFile
	}
	return x, nil
}
