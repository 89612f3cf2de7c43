// Package regularfile opens files that must be regular (a checkpoint's
// shards, its index, a config.json) without ever blocking: open(2) of a FIFO
// waits for a writer, so the kind is checked before opening, the open is
// non-blocking in case the path was swapped meanwhile, and the opened file
// is checked again.
package regularfile
