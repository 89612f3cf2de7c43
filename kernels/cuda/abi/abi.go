package abi

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
)

// Kind is the type of one field of a struct passed to a kernel by value.
type Kind uint8

const (
	// Ptr is a device address, 8 bytes; Field.CType names the pointee.
	Ptr Kind = iota + 1
	// U64 is an unsigned 64-bit integer.
	U64
	// I32 is a signed 32-bit integer (C int).
	I32
	// F32 is an IEEE float32 (C float).
	F32
)

func (k Kind) size() int {
	switch k {
	case Ptr, U64:
		return 8
	case I32, F32:
		return 4
	}
	panic(fmt.Sprintf("abi: unknown field kind %d", uint8(k)))
}

func (k Kind) String() string {
	switch k {
	case Ptr:
		return "pointer"
	case U64:
		return "u64"
	case I32:
		return "int32"
	case F32:
		return "float32"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Field is one member of a kernel parameter struct.
type Field struct {
	Name  string // the C member name
	Kind  Kind
	CType string // for Ptr: the C pointer type, e.g. "const u8*"; empty otherwise
	Doc   string // one line, written beside the member in the header
}

func (f Field) cType() string {
	switch f.Kind {
	case Ptr:
		return f.CType
	case U64:
		return "u64"
	case I32:
		return "int"
	case F32:
		return "float"
	}
	panic(fmt.Sprintf("abi: field %s: unknown kind %d", f.Name, uint8(f.Kind)))
}

// Struct is a C struct that the host packs byte by byte and a kernel takes
// by value. Members are laid out in order at their natural alignment (the
// C rule the device compiler follows); the size is rounded up to the
// largest alignment.
type Struct struct {
	Name   string
	Doc    string
	Fields []Field

	once  sync.Once // the layout, computed at first use (Fields must not change after)
	slots []slot
	size  int
}

// slot is a field's place in the layout and its kind: what a Packer reads
// for every field it sets, kept apart from Field's names and docs.
type slot struct {
	off  int
	kind Kind
}

// FieldID indexes Struct.Fields.
type FieldID int

// Offset returns the byte offset of field f.
func (s *Struct) Offset(f FieldID) int {
	slots, _ := s.layout()
	return slots[f].off
}

// Size returns sizeof the struct.
func (s *Struct) Size() int {
	_, n := s.layout()
	return n
}

// maxFields bounds a Struct's fields: a Packer tracks them in one word.
const maxFields = 64

func (s *Struct) layout() ([]slot, int) {
	s.once.Do(func() { s.slots, s.size = s.computeLayout() })
	return s.slots, s.size
}

func (s *Struct) computeLayout() ([]slot, int) {
	if len(s.Fields) > maxFields {
		panic(fmt.Sprintf("abi: %s has %d fields, more than %d", s.Name, len(s.Fields), maxFields))
	}
	slots := make([]slot, len(s.Fields))
	off, maxAlign := 0, 1
	for i, f := range s.Fields {
		a := f.Kind.size()
		off = (off + a - 1) / a * a
		slots[i] = slot{off: off, kind: f.Kind}
		off += a
		maxAlign = max(maxAlign, a)
	}
	return slots, (off + maxAlign - 1) / maxAlign * maxAlign
}

// Packer fills one value of a Struct in the layout the kernels read. Every
// field must be set exactly once; Bytes reports those that were not.
type Packer struct {
	s     *Struct
	slots []slot
	b     []byte
	set   uint64 // bit f: field f was set
}

// Pack starts a value of s in new memory.
func (s *Struct) Pack() *Packer {
	p := s.PackInto(make([]byte, s.Size()))
	return &p
}

// PackInto starts a value of s in dst (at least Size() bytes; the value
// is its first Size() bytes, zeroed first so that padding is zero): a
// caller that reuses dst packs without allocating.
func (s *Struct) PackInto(dst []byte) Packer {
	slots, n := s.layout()
	if len(dst) < n {
		panic(fmt.Sprintf("abi: packing %s (%d bytes) into %d bytes", s.Name, n, len(dst)))
	}
	dst = dst[:n:n]
	clear(dst)
	return Packer{s: s, slots: slots, b: dst}
}

// claim marks field f set and returns its offset. f must be a field of
// kind k not set before: a mismatch is a programming error in the host
// code, so it panics (the CPU tests pack every field of every launch).
// Every eager launch packs two values, so the checks read only the field's
// slot.
func (p *Packer) claim(f FieldID, k Kind) int {
	if uint(f) >= uint(len(p.slots)) || p.slots[f].kind != k || p.set&(1<<f) != 0 {
		p.misuse(f, k)
	}
	p.set |= 1 << f
	return p.slots[f].off
}

// misuse panics with what claim found wrong with setting field f as k.
//
//go:noinline
func (p *Packer) misuse(f FieldID, k Kind) {
	if uint(f) >= uint(len(p.s.Fields)) {
		panic(fmt.Sprintf("abi: %s has no field %d", p.s.Name, f))
	}
	fd := &p.s.Fields[f]
	if fd.Kind != k {
		panic(fmt.Sprintf("abi: %s.%s is a %v, set as a %v", p.s.Name, fd.Name, fd.Kind, k))
	}
	panic(fmt.Sprintf("abi: %s.%s set twice", p.s.Name, fd.Name))
}

// Ptr sets a pointer field to a device address.
func (p *Packer) Ptr(f FieldID, addr uint64) {
	binary.LittleEndian.PutUint64(p.b[p.claim(f, Ptr):], addr)
}

// U64 sets a u64 field.
func (p *Packer) U64(f FieldID, v uint64) { binary.LittleEndian.PutUint64(p.b[p.claim(f, U64):], v) }

// I32 sets an int field.
func (p *Packer) I32(f FieldID, v int32) {
	binary.LittleEndian.PutUint32(p.b[p.claim(f, I32):], uint32(v))
}

// F32 sets a float field.
func (p *Packer) F32(f FieldID, v float32) {
	binary.LittleEndian.PutUint32(p.b[p.claim(f, F32):], math.Float32bits(v))
}

// Bool sets an int field to 1 or 0.
func (p *Packer) Bool(f FieldID, v bool) {
	var i int32
	if v {
		i = 1
	}
	p.I32(f, i)
}

// Bytes returns the packed value, or an error naming every field left unset.
func (p *Packer) Bytes() ([]byte, error) {
	if p.set == 1<<len(p.s.Fields)-1 {
		return p.b, nil
	}
	var missing []string
	for i, f := range p.s.Fields {
		if p.set&(1<<i) == 0 {
			missing = append(missing, f.Name)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("abi: %s fields not set: %s", p.s.Name, strings.Join(missing, ", "))
	}
	return p.b, nil
}

// Raw reads back the bits of field f of a packed value (for tests and
// dumps): a pointer or u64 whole, an int or float as its 32 bits.
func (s *Struct) Raw(b []byte, f FieldID) uint64 {
	slots, _ := s.layout()
	var v uint64
	for i := range slots[f].kind.size() {
		v |= uint64(b[slots[f].off+i]) << (8 * i)
	}
	return v
}

// Const is one integer constant shared by the host and the kernels.
type Const struct {
	Name  string // the C name
	Value int
	Doc   string
}

// ConstGroup is a C enum of related constants.
type ConstGroup struct {
	Doc    string
	Consts []Const
}
