// Package deps pins the module's allowed dependencies in go.mod until real code imports them; remove it once every one is used.
package deps

import (
	_ "github.com/ebitengine/purego"
	_ "github.com/rs/zerolog"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/stretchr/testify/require"
	_ "golang.org/x/sync/errgroup"
)
