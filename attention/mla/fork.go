package mla

import (
	"context"
	"errors"
	"fmt"
)

// KVForker is an optional interface of backends with a second stream: the
// chain (DESIGN.md section 7 step 5) issues the KV prologue there, right
// after the fused A GEMM that produces the latent, so it runs under q_norm
// and the wq_b GEMM on the main stream.
//
// ForkKV orders the side stream after all work issued so far on the main
// stream, issues the KV prologue (KVNormRopeStore) of every launch there and
// returns at once. JoinKV orders all later work on the main stream after
// that side work. Both are plain stream-ordering operations (an event
// recorded on one stream, waited on by the other), so they also work inside
// a captured CUDA graph, where they become the graph's fork and join edges.
// A backend without a second stream does not implement KVForker; the chain
// then runs the KV prologue in order on its one stream.
type KVForker interface {
	ForkKV(ctx context.Context, launches []Launch, a *LayerArgs) error
	JoinKV(ctx context.Context) error
}

// AuxRunner is an optional interface of backends with a third stream beside
// the side stream of KVForker and SideRunner. Aux issues fn's launches
// there, after the work issued so far on the main stream, so that they
// overlap the main stream's next work and the side stream's; KVForker.JoinKV
// orders later main-stream work after them too. MarkSide records how far the
// side stream's issued work has reached (call it inside Side, after the
// launch to wait for); AwaitSide orders the current stream's later launches
// (inside Aux: the third stream's) after the side stream's work up to that
// mark. A mark lasts until the next JoinKV (a graph capture may not wait for
// an event recorded outside it); AwaitSide without one is ErrNoSideMark.
// All of them are stream orderings (events), so they also build a CUDA
// graph's branches.
//
// The engine runs a ratio-4 layer's indexer query path there where
// AuxQuery says so (the backend's tuning): its wq_b GEMM, from q_norm's
// activation, then its query step, which reads weights_proj's columns of
// the side stream's projection GEMM (marked after that GEMM).
type AuxRunner interface {
	AuxQuery() bool
	Aux(ctx context.Context, fn func() error) error
	MarkSide(ctx context.Context) error
	AwaitSide(ctx context.Context) error
}

// ErrNoSideMark is AwaitSide without a MarkSide since the last join.
var ErrNoSideMark = errors.New("mla: no side-stream mark to wait for since the last join")

// QOnly runs only the Q prologue of every launch (QNormRopeQuant): the
// chain's last step once the KV prologue was issued on its own.
func QOnly(ctx context.Context, b Backend, launches []Launch, a *LayerArgs) error {
	for _, l := range launches {
		if err := b.QNormRopeQuant(ctx, l, a); err != nil {
			return fmt.Errorf("mla: %s Q launch (%v): %w", b.Name(), l, err)
		}
	}
	return nil
}

// KVOnly runs only the KV prologue of every launch (KVNormRopeStore).
func KVOnly(ctx context.Context, b Backend, launches []Launch, a *LayerArgs) error {
	for _, l := range launches {
		if err := b.KVNormRopeStore(ctx, l, a); err != nil {
			return fmt.Errorf("mla: %s KV launch (%v): %w", b.Name(), l, err)
		}
	}
	return nil
}
