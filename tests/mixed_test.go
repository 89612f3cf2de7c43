package tests

import (
	"testing"

	"github.com/dsv4mla/prologue/attention/mla/cpu"
	"github.com/dsv4mla/prologue/attention/mla/mlatest"
)

func TestMixedEqualsPartsCPU(t *testing.T) { mlatest.MixedEqualsParts(t, cpu.New(0)) }
