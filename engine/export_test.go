package engine

import "github.com/dsv4mla/prologue/attention/mla"

// VerifyKeptRows makes every Begin of e compare the metadata it uploaded
// with the full encoding, and its block-table rows with their page lists
// (the rows a build kept, and the ones an upload skipped, must change
// nothing).
func VerifyKeptRows(e *Engine) { e.verifyKeptRows = true }

// KeptRows is how many block-table rows e's last Begin kept from the build
// before it.
func KeptRows(e *Engine) int {
	_, from, rows, rebuilt := e.rows.Kept()
	if from == 0 {
		return 0
	}
	return rows - len(rebuilt)
}

// IndexerStepArgs is indexerStepArgs, for the tests of the indexer cache's
// accessors.
func IndexerStepArgs(e *Engine, layer int) (mla.CompressStepArgs, bool) {
	return e.indexerStepArgs(layer)
}

// IndexerBuffers is indexerBuffers.
func IndexerBuffers(e *Engine, layer int) (cache, ring mla.Buffer) { return e.indexerBuffers(layer) }
