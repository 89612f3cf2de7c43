package cuda

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sharedHelpers are common.cuh's definitions that the programs used to
// copy (issue 25): each is defined there and nowhere else.
var sharedHelpers = []string{
	"pdl_wait", "pdl_trigger", "bf16_to_f32", "bf16x2_rn", "round2", "e4m3x2", "pow2i", "ue8m0_exp",
	"ld_stream", "splitk_store4", "splitk_reduce",
}

// definitions counts the definitions of device function name in src (a
// call has no __device__ before it).
func definitions(src, name string) int {
	return len(regexp.MustCompile(`__device__[^;{}()]*\b`+name+`\s*\(`).FindAllStringIndex(src, -1))
}

// ownedByABI finds the short integer typedefs (abi.h's) and FULL
// (common.cuh's).
var ownedByABI = regexp.MustCompile(`(?m)^\s*(typedef\s+unsigned[^;]*\bu(8|16|32|64)\s*;|#define\s+FULL\b)`)

// TestOneDefinitionOfEachHelper reads every .cu and .cuh of this folder
// (a new kernel file included): each includes common.cuh (or is included
// by a program that does), and none but common.cuh defines one of its
// helpers or abi.h's typedefs.
func TestOneDefinitionOfEachHelper(t *testing.T) {
	files, err := filepath.Glob("*.cu*")
	require.NoError(t, err)
	require.Contains(t, files, "common.cuh")
	require.GreaterOrEqual(t, len(files), 10, "the kernel sources: %v", files)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		src := string(b)
		if f == "common.cuh" {
			require.Equal(t, commonHeader, src, "the embedded common.cuh")
			for _, h := range sharedHelpers {
				require.Positive(t, definitions(src, h), "common.cuh defines %s", h)
			}
			continue
		}
		if strings.HasSuffix(f, ".cu") {
			require.Contains(t, src, "\n#include \"common.cuh\"", "%s includes common.cuh", f)
		}
		for _, h := range sharedHelpers {
			require.Zero(t, definitions(src, h), "%s defines %s again: use common.cuh's", f, h)
		}
		require.Empty(t, ownedByABI.FindAllString(src, -1), "%s: typedefs and FULL come from abi.h and common.cuh", f)
	}
}

// TestDefinitionsSeesACopy: the scan sees a copied helper and a typedef,
// and not a call, so the test above can fail.
func TestDefinitionsSeesACopy(t *testing.T) {
	src := "__device__ __forceinline__ void pdl_wait() { asm volatile(\"\"); }\nvoid f() { pdl_wait(); }\n" +
		"template <typename OUT>\n__device__ __forceinline__ void splitk_reduce(const float* p) {}\n"
	require.Equal(t, 1, definitions(src, "pdl_wait"))
	require.Equal(t, 1, definitions(src, "splitk_reduce"))
	require.Zero(t, definitions(src, "pdl_trigger"))
	require.Len(t, ownedByABI.FindAllString("typedef unsigned short u16;\n#define FULL 0xffffffffu\n", -1), 2)
}

// bindingFiles are the sources whose kernels take their launch's fields in
// one abi.h struct and bind them to locals.
var bindingFiles = []string{"common.cuh", "gemm_fp8.cu", "gemm_bf16.cu", "gemm_bf16_mma.cu", "chain.cu", "compress.cu", "indexer.cu"}

var binding = regexp.MustCompile(`(?:^|[\s,(*])(\w+) = (?:p|args)\.(\w+)[;,]`)

// TestFieldsBoundByName: where a kernel copies a field of its parameter
// struct into a local, the local has the field's name, so a field read
// into the wrong variable shows as a name mismatch (the host side is
// checked field by field in attention/mla/cuda's packing tests).
func TestFieldsBoundByName(t *testing.T) {
	for _, f := range bindingFiles {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		ms := binding.FindAllStringSubmatch(string(b), -1)
		require.NotEmpty(t, ms, "%s binds its parameters", f)
		for _, m := range ms {
			require.Equal(t, m[2], m[1], "%s: %q", f, strings.TrimSpace(m[0]))
		}
	}
	require.Equal(t, [][]string{{" m = p.n,", "m", "n"}}, binding.FindAllStringSubmatch("const int m = p.n, k = 1;", -1), "the scan sees a swap")
}
