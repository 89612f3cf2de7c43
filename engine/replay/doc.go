// Package replay feeds a batch trace (package engine/trace) to an engine
// line by line, as a server's step loop would: it synthesizes each layer's
// activations from a seed, runs the iteration, finishes sequences, and
// reports tokens, launches and time per iteration.
//
// With Options.Verify it runs every iteration through a second engine on the
// cpu backend as well, with the same inputs, and compares every byte of the
// Q output after each layer and of every cache page the iteration wrote;
// the first difference stops the replay with a *VerifyError. With
// Options.DumpDir it writes chosen (iteration, layer) pairs as safetensors
// files of the layer's inputs and outputs.
//
// A line the engine refuses (an unknown or finished sequence, a batch that
// does not fit the pool or the capacity, a prompt past the RoPE table)
// stops the replay with a *trace.LineError naming the line; the cache is
// left exactly as the previous line left it.
package replay
