// Package safetensors writes the safetensors format (an 8-byte little-endian
// header length, a JSON header of dtype, shape and data offsets per tensor
// plus a __metadata__ map of strings, then the raw bytes), so dumps can be
// checked with PyTorch. It reads it back too: whole images (Read, for
// tests) or a header alone (ParseHeader) followed by ranged reads of single
// tensors or row ranges (TensorInfo.ReadRows), for checkpoints too large to
// read whole.
package safetensors
