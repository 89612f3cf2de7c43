package mla

import (
	"context"
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
