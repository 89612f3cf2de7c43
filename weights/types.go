package weights

// FP8Matrix is one FP8 weight of the checkpoint on the host: Data is [N][K]
// e4m3 row-major; Scale is [ceil(N/128)][ceil(K/128)] float32 row-major, one
// scale per 128x128 block (a checkpoint's e8m0 exponent bytes are widened
// exactly: 2^(e-127)).
type FP8Matrix struct {
	N, K  int
	Data  []byte
	Scale []float32
}

// ScaleRows and ScaleCols are the scale grid's dimensions.
func (m *FP8Matrix) ScaleRows() int { return (m.N + 127) / 128 }
func (m *FP8Matrix) ScaleCols() int { return (m.K + 127) / 128 }
