package bytediff

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFirst(t *testing.T) {
	assert.Equal(t, -1, First([]byte{1, 2, 3}, []byte{1, 2, 3}))
	assert.Equal(t, 1, First([]byte{1, 2, 3}, []byte{1, 9, 3}))
	assert.Equal(t, 2, First([]byte{1, 2}, []byte{1, 2, 3}))
	assert.Equal(t, 2, First([]byte{1, 2, 3}, []byte{1, 2}))
	assert.Equal(t, 0, First(nil, []byte{7}))
	assert.Equal(t, -1, First(nil, []byte{}))
}
