package metadata

import "testing"

func TestPhaseStringAndParse(t *testing.T) {
	for _, c := range []struct {
		phase Phase
		name  string
	}{{Context, "context"}, {Generation, "generation"}} {
		if got := c.phase.String(); got != c.name {
			t.Errorf("%d.String() = %q, want %q", c.phase, got, c.name)
		}
		p, err := ParsePhase(c.name)
		if err != nil || p != c.phase {
			t.Errorf("ParsePhase(%q) = %v, %v; want %v", c.name, p, err, c.phase)
		}
	}
	if got := Phase(9).String(); got != "Phase(9)" {
		t.Errorf("Phase(9).String() = %q", got)
	}
	for _, bad := range []string{"", "Context", "ctx", "gen", "decode", "Phase(0)"} {
		if _, err := ParsePhase(bad); err == nil {
			t.Errorf("ParsePhase(%q) accepted", bad)
		}
	}
}

func FuzzParsePhase(f *testing.F) {
	for _, s := range []string{"context", "generation", "", "Phase(3)", "CONTEXT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePhase(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("ParsePhase(%q) = %v, which prints as %q", s, p, p.String())
		}
	})
}
