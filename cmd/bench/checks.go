package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/dsv4mla/prologue/attention/mla"
	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/internal/bytediff"
	"github.com/dsv4mla/prologue/internal/safetensors"
	"github.com/dsv4mla/prologue/kvcache"
)

// checkCase is one layer written for bench/check_peers.py.
type checkCase struct {
	name   string
	s      shape
	format kvcache.Format
	q      mla.QFormat
}

// checkCases are a generation batch in every cache format and a context
// batch with bf16 Q.
func checkCases() []checkCase {
	var cases []checkCase
	for _, f := range kvcache.Formats() {
		cases = append(cases, checkCase{"gen_b8_mtp3_" + f.String(), generationShape(8, 3), f, mla.QFP8})
	}
	return append(cases, checkCase{"ctx_1024_fp8_ue8m0_qbf16", contextShape(1024), kvcache.FormatFP8UE8M0, mla.QBF16})
}

// writeChecks runs small cases on the GPU, checks every byte against the
// CPU backend, and writes them for bench/check_peers.py.
func writeChecks(d *device, dir string, md model) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var notes []string
	for _, c := range checkCases() {
		note, err := writeCheck(d, dir, md, c)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", c.name, err)
		}
		fmt.Println("check", note)
		notes = append(notes, note)
	}
	return notes, nil
}

func writeCheck(d *device, dir string, md model, c checkCase) (string, error) {
	ctx := context.Background()
	ls, err := d.setupLayers(md, c.s, layerSpec{sets: 1, cacheFormat: c.format})
	if err != nil {
		return "", err
	}
	defer d.free(ls)
	a := ls.withFormats(0, c.format, c.q)
	a.CacheConfig.KVScale = 0.75
	a.QScale = 1.5
	poolBytes := a.CacheConfig.PoolBytes()
	cacheIn := make([]byte, poolBytes)
	for i := range cacheIn {
		cacheIn[i] = byte(i*7 + 3)
	}
	if err := d.be.Write(a.Cache, 0, cacheIn); err != nil {
		return "", err
	}
	if err := mla.RunLayer(ctx, d.be, ls.launches, &a); err != nil {
		return "", err
	}
	T := ls.m.PaddedTokens
	rowElems := md.QLora + 512
	var readErr error
	read := func(buf mla.Buffer, n int) []byte {
		p := make([]byte, n)
		if err := d.be.Read(p, buf, 0); err != nil && readErr == nil {
			readErr = err
		}
		return p
	}
	fused := read(a.Latent, T*rowElems*2)
	qin := read(a.QIn, T*md.Heads*1024)
	w := read(a.KVWeight, 2048)
	rope := read(a.Rope, a.RopePositions*256)
	cacheOut := read(a.Cache, poolBytes)
	qout := read(a.QOut, T*md.Heads*512*a.QFormat.ElemBytes())
	if readErr != nil {
		return "", readErr
	}

	// The same layer on the CPU backend must give the same bytes.
	host := cpu.New(0)
	ha := a
	var upErr error
	up := func(p []byte) mla.Buffer {
		buf, err := host.Alloc(len(p))
		if err == nil {
			err = host.Write(buf, 0, p)
		}
		if err != nil && upErr == nil {
			upErr = err
		}
		return buf
	}
	ha.Latent, ha.QIn, ha.KVWeight, ha.Rope, ha.Cache = up(fused), up(qin), up(w), up(rope), up(cacheIn)
	ha.QOut = up(make([]byte, len(qout)))
	if upErr != nil {
		return "", upErr
	}
	if ha.Meta, err = mla.NewMetadataBuffers(host, ls.m.NumSeqs, ls.m.MaxPages); err != nil {
		return "", err
	}
	if err := ha.Meta.Upload(host, ls.m, ls.pages); err != nil {
		return "", err
	}
	if err := mla.RunLayer(ctx, host, ls.launches, &ha); err != nil {
		return "", err
	}
	if i := bytediff.First(cpu.Bytes(ha.Cache), cacheOut); i >= 0 {
		return "", fmt.Errorf("GPU cache differs from the CPU backend at byte %d", i)
	}
	if i := bytediff.First(cpu.Bytes(ha.QOut), qout); i >= 0 {
		return "", fmt.Errorf("GPU Q differs from the CPU backend at byte %d", i)
	}

	positions := make([]byte, 4*T)
	slots := make([]byte, 8*T)
	for t := range T {
		_, pos, _ := ls.m.Row(t)
		binary.LittleEndian.PutUint32(positions[4*t:], uint32(pos))
		binary.LittleEndian.PutUint64(slots[8*t:], uint64(ls.m.Slot(t)))
	}
	qshape := []int{T, md.Heads, 512 * a.QFormat.ElemBytes()}
	tensors := []safetensors.Tensor{
		{Name: "fused_a", DType: "BF16", Shape: []int{T, rowElems}, Data: fused},
		{Name: "q", DType: "BF16", Shape: []int{T, md.Heads, 512}, Data: qin},
		{Name: "kv_weight", DType: "F32", Shape: []int{512}, Data: w},
		{Name: "cos_sin", DType: "F32", Shape: []int{a.RopePositions, 32, 2}, Data: rope},
		{Name: "positions", DType: "I32", Shape: []int{T}, Data: positions},
		{Name: "slots", DType: "I64", Shape: []int{T}, Data: slots},
		{Name: "cache_in", DType: "U8", Shape: []int{ls.pages, c.format.PageBytes(pageSize)}, Data: cacheIn},
		{Name: "cache_out", DType: "U8", Shape: []int{ls.pages, c.format.PageBytes(pageSize)}, Data: cacheOut},
		{Name: "q_out", DType: "U8", Shape: qshape, Data: qout},
	}
	meta := map[string]string{
		"format": c.format.String(), "q_format": a.QFormat.String(), "page_size": strconv.Itoa(pageSize),
		"kv_scale": strconv.FormatFloat(float64(a.CacheConfig.KVScale), 'g', -1, 32),
		"q_scale":  strconv.FormatFloat(float64(a.QScale), 'g', -1, 32), "q_lora_rank": strconv.Itoa(md.QLora),
		"heads": strconv.Itoa(md.Heads),
	}
	if err := safetensors.WriteFile(filepath.Join(dir, c.name+".safetensors"), tensors, meta); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: %d tokens, GPU == CPU backend byte for byte (%d cache bytes, %d Q bytes)", c.name, T, poolBytes, len(qout)), nil
}
