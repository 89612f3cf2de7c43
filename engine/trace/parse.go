package trace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// ParseLine parses one non-comment line; n is its line number for errors,
// which are *LineError.
//
// It walks the JSON tokens itself rather than decoding into structs, so that
// it can refuse what encoding/json would accept silently (a key in another
// case such as "SEQ", a key given twice) and word every message in terms of
// the trace format, never of Go types. A null field is the same as an absent
// one; a null line is not an object and is refused.
func ParseLine(line []byte, n int) (Step, error) {
	if len(bytes.TrimSpace(line)) == 0 {
		return Step{}, &LineError{Line: n, Err: errors.New("a line must be a JSON object, not an empty line")}
	}
	p := &lineParser{dec: json.NewDecoder(bytes.NewReader(line))}
	p.dec.UseNumber()
	s, err := p.step()
	if err != nil {
		return Step{}, &LineError{Line: n, Err: err}
	}
	end := p.dec.InputOffset()
	if _, err := p.dec.Token(); err != io.EOF {
		return Step{}, &LineError{Line: n, Err: fmt.Errorf("text after the JSON object at byte %d; one object per line", end)}
	}
	s.Line = n
	if err := s.Validate(); err != nil {
		return Step{}, &LineError{Line: n, Err: err}
	}
	return s, nil
}

// The keys of each object, exactly as they must be written.
var (
	stepKeys       = []string{"context", "generation", "finish"}
	chunkKeys      = []string{"seq", "tokens"}
	generationKeys = []string{"mtp", "seqs", "accept"}
)

const (
	wantID     = "a sequence id (a whole number in [0, 18446744073709551615])"
	wantIDList = "an array of sequence ids"
)

var (
	wantTokens = fmt.Sprintf("a whole number in [1, %d]", MaxChunkTokens)
	wantMTP    = fmt.Sprintf("a whole number in [0, %d]", MaxMTP)
	wantAccept = fmt.Sprintf("a whole number in [1, %d] (1 + mtp at most)", MaxMTP+1)
)

type lineParser struct {
	dec *json.Decoder
}

// next returns the next token, with syntax errors in the trace's words.
func (p *lineParser) next() (json.Token, error) {
	tok, err := p.dec.Token()
	if err == nil {
		return tok, nil
	}
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return nil, fmt.Errorf("malformed JSON at byte offset %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return nil, errors.New("malformed JSON: the object is cut short")
	}
	return nil, fmt.Errorf("malformed JSON: %v", err)
}

// describe names a token's JSON kind and value for an error message.
func describe(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		switch v {
		case '{':
			return "an object"
		case '[':
			return "an array"
		}
	case string:
		if len(v) > 40 {
			v = v[:37] + "..."
		}
		return fmt.Sprintf("the string %q", v)
	case json.Number:
		return string(v)
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return "null"
	}
	return fmt.Sprint(tok)
}

func wrong(at, want string, tok json.Token) error {
	return fmt.Errorf("%s: want %s, not %s", at, want, describe(tok))
}

// object reads the members of an object whose '{' was read, calling field
// for each key after checking it is known, in the right case, and new.
func (p *lineParser) object(at string, known []string, field func(key, at string) error) error {
	seen := map[string]bool{}
	for {
		tok, err := p.next()
		if err != nil {
			return err
		}
		if tok == json.Delim('}') {
			return nil
		}
		key := tok.(string) // the decoder only yields string keys here
		in := ""
		if at != "" {
			in = " in " + at
		}
		if !slices.Contains(known, key) {
			for _, k := range known {
				if strings.EqualFold(k, key) {
					return fmt.Errorf("unknown field %q%s: field names are lower case, write %q", key, in, k)
				}
			}
			return fmt.Errorf("unknown field %q%s (known fields: %s)", key, in, strings.Join(known, ", "))
		}
		if seen[key] {
			return fmt.Errorf("field %q appears twice%s; give it once", key, in)
		}
		where := key
		if at != "" {
			where = at + "." + key
		}
		seen[key] = true
		if err := field(key, where); err != nil {
			return err
		}
	}
}

// array reads an array value: null (absent), or each element through elem.
// It reports whether the value was an array.
func (p *lineParser) array(at, want string, elem func(i int, at string, tok json.Token) error) (bool, error) {
	tok, err := p.next()
	if err != nil {
		return false, err
	}
	if tok == nil {
		return false, nil
	}
	if tok != json.Delim('[') {
		return false, wrong(at, want, tok)
	}
	for i := 0; ; i++ {
		tok, err := p.next()
		if err != nil {
			return false, err
		}
		if tok == json.Delim(']') {
			return true, nil
		}
		if err := elem(i, fmt.Sprintf("%s[%d]", at, i), tok); err != nil {
			return false, err
		}
	}
}

func parseID(at string, tok json.Token) (uint64, error) {
	if n, ok := tok.(json.Number); ok {
		if v, err := strconv.ParseUint(string(n), 10, 64); err == nil {
			return v, nil
		}
	}
	return 0, wrong(at, wantID, tok)
}

// parseInt reads a whole number; the range is Validate's to check, but a
// number past int is refused here with the range it must be in.
func parseInt(at, want string, tok json.Token) (int, error) {
	if n, ok := tok.(json.Number); ok {
		if v, err := strconv.ParseInt(string(n), 10, 64); err == nil && v >= math.MinInt && v <= math.MaxInt {
			return int(v), nil
		}
	}
	return 0, wrong(at, want, tok)
}

// scalar reads a scalar value; ok is false for null.
func (p *lineParser) scalar() (tok json.Token, ok bool, err error) {
	tok, err = p.next()
	return tok, err == nil && tok != nil, err
}

func (p *lineParser) step() (Step, error) {
	var s Step
	tok, err := p.next()
	if err != nil {
		return s, err
	}
	if tok != json.Delim('{') {
		return s, fmt.Errorf("a line must be a JSON object, not %s", describe(tok))
	}
	err = p.object("", stepKeys, func(key, at string) error {
		switch key {
		case "context":
			_, err := p.array(at, `an array of chunks {"seq":..,"tokens":..}`, func(i int, at string, tok json.Token) error {
				c, err := p.chunk(at, tok)
				s.Context = append(s.Context, c)
				return err
			})
			return err
		case "generation":
			g, err := p.generation(at)
			s.Generation = g
			return err
		default: // finish
			_, err := p.array(at, wantIDList, func(i int, at string, tok json.Token) error {
				id, err := parseID(at, tok)
				s.Finish = append(s.Finish, id)
				return err
			})
			return err
		}
	})
	return s, err
}

func (p *lineParser) chunk(at string, tok json.Token) (Chunk, error) {
	var c Chunk
	if tok != json.Delim('{') {
		return c, wrong(at, `a chunk {"seq":..,"tokens":..}`, tok)
	}
	var hasSeq, hasTokens bool
	err := p.object(at, chunkKeys, func(key, at string) error {
		tok, ok, err := p.scalar()
		if err != nil || !ok {
			return err
		}
		if key == "seq" {
			c.Seq, err = parseID(at, tok)
			hasSeq = true
		} else {
			c.Tokens, err = parseInt(at, wantTokens, tok)
			hasTokens = true
		}
		return err
	})
	switch {
	case err != nil:
		return c, err
	case !hasSeq:
		return c, fmt.Errorf(`%s: missing "seq"`, at)
	case !hasTokens:
		return c, fmt.Errorf(`%s (seq %d): missing "tokens"`, at, c.Seq)
	}
	return c, nil
}

func (p *lineParser) generation(at string) (*Generation, error) {
	tok, err := p.next()
	if err != nil || tok == nil {
		return nil, err
	}
	if tok != json.Delim('{') {
		return nil, wrong(at, `an object {"mtp":..,"seqs":[..]}`, tok)
	}
	g := &Generation{}
	hasSeqs := false
	err = p.object(at, generationKeys, func(key, at string) error {
		if key == "seqs" {
			var err error
			hasSeqs, err = p.array(at, wantIDList, func(i int, at string, tok json.Token) error {
				id, err := parseID(at, tok)
				g.Seqs = append(g.Seqs, id)
				return err
			})
			return err
		}
		if key == "accept" {
			isArray, err := p.array(at, "an array of accepted token counts, one per sequence", func(i int, at string, tok json.Token) error {
				n, err := parseInt(at, wantAccept, tok)
				g.Accept = append(g.Accept, n)
				return err
			})
			if isArray && g.Accept == nil {
				g.Accept = []int{} // [] is not "absent": Validate refuses it
			}
			return err
		}
		tok, ok, err := p.scalar()
		if err != nil || !ok {
			return err
		}
		g.MTP, err = parseInt(at, wantMTP, tok)
		return err
	})
	if err != nil {
		return nil, err
	}
	if !hasSeqs {
		return nil, fmt.Errorf(`%s: missing "seqs"`, at)
	}
	if g.Seqs == nil {
		g.Seqs = []uint64{}
	}
	return g, nil
}
