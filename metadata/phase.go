package metadata

import "fmt"

// Phase is the serving phase of one request in a batch.
type Phase uint8

const (
	// Context is prefill: a ragged chunk of prompt tokens, possibly continuing
	// a chunked prefill at a cached offset.
	Context Phase = iota
	// Generation is decode: 1 + MTP draft tokens appended to a known sequence.
	Generation
)

// String returns "context" or "generation", or "Phase(n)" for an invalid value.
func (p Phase) String() string {
	switch p {
	case Context:
		return "context"
	case Generation:
		return "generation"
	default:
		return fmt.Sprintf("Phase(%d)", uint8(p))
	}
}

// ParsePhase is the inverse of Phase.String for the two valid phases.
func ParsePhase(s string) (Phase, error) {
	switch s {
	case "context":
		return Context, nil
	case "generation":
		return Generation, nil
	default:
		return 0, fmt.Errorf("metadata: unknown phase %q (want \"context\" or \"generation\")", s)
	}
}
