package cuda_test

import (
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	kernels "github.com/dsv4mla/prologue/kernels/cuda"
	"github.com/dsv4mla/prologue/kernels/cuda/abi"
)

// The embedded abi.h is exactly what the generator writes: regenerate it
// with go generate ./kernels/cuda after changing the table in
// kernels/cuda/abi (or a constant it takes from kvcache, mla, numerics).
func TestABIHeaderIsGenerated(t *testing.T) {
	require.Equal(t, abi.Header(), kernels.ABIHeader(),
		"kernels/cuda/abi.h is stale: run go generate ./kernels/cuda")
}

// kernelDefs matches the kernel-defining macro invocations of prologue.cu:
// KV_KERNEL(name, FMT_X), Q_KERNEL(name, QFMT_X) and
// LAYER_KERNEL(name, FMT_X, QFMT_Y), one per line, and the direct path's
// KV_DIRECT_KERNEL, Q_DIRECT_KERNEL and LAYER_DIRECT_KERNEL.
var kernelDefs = regexp.MustCompile(`(?m)^(KV|Q|LAYER)(_DIRECT)?_KERNEL\(\s*(\w+)\s*,\s*(\w+)\s*(?:,\s*(\w+)\s*)?\)\s*$`)

// kernelDef is one macro invocation: macro is KV, Q or LAYER with
// "_DIRECT" for the direct path's macros.
type kernelDef struct{ macro, name, a, b string }

func parseKernels(t *testing.T, src string) map[string]kernelDef {
	t.Helper()
	defs := map[string]kernelDef{}
	for _, m := range kernelDefs.FindAllStringSubmatch(src, -1) {
		d := kernelDef{m[1] + m[2], m[3], m[4], m[5]}
		_, dup := defs[d.name]
		require.False(t, dup, "kernel %s defined twice", d.name)
		defs[d.name] = d
	}
	return defs
}

// TestEveryKernelDefined: every kernel the host loads (abi.Kernels: on each
// path, a KV kernel per cache format, a Q kernel per Q format and a fused
// layer kernel for every (cache format, Q format) pair) is defined in
// prologue.cu by its path's macro with the ids of its own formats, and
// prologue.cu defines no kernel the host does not know.
func TestEveryKernelDefined(t *testing.T) {
	defs := parseKernels(t, kernels.PrologueFile())
	ks := abi.Kernels()
	require.Len(t, defs, len(ks), "prologue.cu defines %d kernels, abi.Kernels lists %d", len(defs), len(ks))
	for _, k := range ks {
		d, ok := defs[k.Name]
		require.True(t, ok, "prologue.cu does not define kernel %s", k.Name)
		var direct string
		switch k.Path {
		case abi.Streaming:
		case abi.Direct:
			direct = "_DIRECT"
		default:
			t.Fatalf("kernel %s on unknown path %v", k.Name, k.Path)
		}
		switch k.Kind {
		case abi.KindKV:
			require.Equal(t, kernelDef{"KV" + direct, k.Name, abi.FormatConst(k.Format), ""}, d)
		case abi.KindQ:
			require.Equal(t, kernelDef{"Q" + direct, k.Name, abi.QFormatConst(k.QFormat), ""}, d)
		case abi.KindLayer:
			require.Equal(t, kernelDef{"LAYER" + direct, k.Name, abi.FormatConst(k.Format), abi.QFormatConst(k.QFormat)}, d)
		default:
			t.Fatalf("kernel %s of unknown kind %d", k.Name, k.Kind)
		}
	}
}

// TestParseKernelsCatchesDrift: the parser sees a wrong format id and a
// missing kernel, so the test above can fail.
func TestParseKernelsCatchesDrift(t *testing.T) {
	src := "#define KV_KERNEL(NAME, FMT) x\nKV_KERNEL(kv_bf16, FMT_FP8_UE8M0)\nLAYER_KERNEL(layer_bf16_qfp8, FMT_BF16, QFMT_BF16)\n" +
		"Q_DIRECT_KERNEL(q_fp8_direct, QFMT_BF16)\n"
	defs := parseKernels(t, src)
	require.Equal(t, map[string]kernelDef{
		"kv_bf16":         {"KV", "kv_bf16", "FMT_FP8_UE8M0", ""},
		"layer_bf16_qfp8": {"LAYER", "layer_bf16_qfp8", "FMT_BF16", "QFMT_BF16"},
		"q_fp8_direct":    {"Q_DIRECT", "q_fp8_direct", "QFMT_BF16", ""},
	}, defs)
}

// TestHeadersIncludeABI: common.cuh includes abi.h, and Headers hands
// NVRTC both, byte for byte the embedded files.
func TestHeadersIncludeABI(t *testing.T) {
	require.Contains(t, kernels.CommonHeader(), "\n#include \"abi.h\"\n")
	byName := map[string]string{}
	for _, h := range kernels.Headers() {
		byName[h.Name] = h.Source
	}
	require.Equal(t, kernels.ABIHeader(), byName["abi.h"])
	require.Equal(t, kernels.CommonHeader(), byName["common.cuh"])
	require.Equal(t, kernels.PrologueFile(), byName["prologue.cu"])
}
