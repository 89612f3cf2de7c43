package driver

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNVRTCOptions(t *testing.T) {
	withInclude := fakeEnvironment(map[string]string{"CUDA_HOME": "/opt/cuda"}, "/opt/cuda/include/cuda_bf16.h")
	bare := fakeEnvironment(nil)
	base := []string{"--gpu-architecture=sm_90", "-std=c++17", "-default-device"}
	tests := []struct {
		name    string
		opts    CompileOptions
		env     environment
		want    []string
		wantErr string
	}{
		{"defaults", CompileOptions{}, bare, base, ""},
		{"no fmad", CompileOptions{NoFMAD: true}, bare, append(base[:3:3], "--fmad=false"), ""},
		{"defines sorted by name", CompileOptions{Defines: map[string]string{"ZED": "1", "ALPHA": "", "MID": "a b"}}, bare,
			append(base[:3:3], "-DALPHA", "-DMID=a b", "-DZED=1"), ""},
		{"include order kept, CUDA include after, extras last",
			CompileOptions{IncludeDirs: []string{"/b", "/a"}, CUDAIncludes: true, Extra: []string{"-lineinfo"}}, withInclude,
			append(base[:3:3], "-I/b", "-I/a", "-I/opt/cuda/include", "-lineinfo"), ""},
		{"bad define name", CompileOptions{Defines: map[string]string{"1BAD": "x"}}, bare, nil,
			`CompileOptions.Defines: name "1BAD" is not a C identifier`},
		{"define name with equals", CompileOptions{Defines: map[string]string{"A=B": ""}}, bare, nil, `name "A=B"`},
		{"empty include dir", CompileOptions{IncludeDirs: []string{""}}, bare, nil, "CompileOptions.IncludeDirs: empty directory"},
		{"CUDA includes missing", CompileOptions{CUDAIncludes: true}, bare, nil,
			"CompileOptions.CUDAIncludes is set but no directory with cuda_bf16.h was found; searched /usr/local/cuda/include"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.opts.nvrtcOptions("sm_90", tc.env)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestValidateProgram(t *testing.T) {
	tests := []struct {
		name, src, program, arch string
		wantErr                  string
	}{
		{"ok", "x", "k.cu", "sm_90", ""},
		{"arch-specific", "x", "k.cu", "sm_90a", ""},
		{"family-specific", "x", "k.cu", "sm_100f", ""},
		{"three digits", "x", "k.cu", "sm_120", ""},
		{"no program name", "x", "", "sm_90", "program name is empty"},
		{"blank source", " \n\t", "k.cu", "sm_90", `Compile "k.cu": source is empty`},
		{"no arch", "x", "k.cu", "", "CompileOptions.Arch is empty"},
		{"virtual arch", "x", "k.cu", "compute_90", `CompileOptions.Arch "compute_90" is not a real architecture`},
		{"malformed arch", "x", "k.cu", "sm90", `CompileOptions.Arch "sm90"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validateProgram(tc.src, tc.program, tc.arch)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}

func TestCompileRefusesBadInputWithoutNVRTC(t *testing.T) {
	_, err := Compile("extern \"C\" __global__ void k() {}", "k.cu", CompileOptions{})
	require.ErrorContains(t, err, "CompileOptions.Arch is empty")
	_, err = CompilePTX("extern \"C\" __global__ void k() {}", "k.cu", CompileOptions{Arch: "compute_90"})
	require.ErrorContains(t, err, "not a real architecture")
}

// The tests below need NVRTC but no GPU: compiling for sm_90 works anywhere
// NVRTC loads.

func TestCompileErrorCarriesTheLog(t *testing.T) {
	requireNVRTC(t)
	src := "extern \"C\" __global__ void broken(unsigned int* p) { p[0] = undefined_identifier_xyz; }\n"
	_, err := Compile(src, "broken.cu", CompileOptions{Arch: "sm_90", NoCache: true})
	require.Error(t, err)
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.ErrorIs(t, err, NVRTCErrorCompilation)
	require.Contains(t, ce.Log, "undefined_identifier_xyz", "the log names the culprit")
	require.Contains(t, err.Error(), "undefined_identifier_xyz", "and so does the error message")
	require.Contains(t, err.Error(), "nvrtcCompileProgram: NVRTC_ERROR_COMPILATION")
}

func TestCubinCacheHitAndCorruptionRecovery(t *testing.T) {
	requireNVRTC(t)
	dir := t.TempDir()
	opts := CompileOptions{Arch: "sm_90", CacheDir: dir}

	first, err := CompileDetailed(testKernels, "driver_test.cu", opts)
	require.NoError(t, err)
	require.False(t, first.CacheHit, "cold cache")
	require.NoError(t, first.CacheErr)
	require.True(t, strings.HasPrefix(first.CachePath, dir))
	require.Equal(t, elfMagic, first.Cubin[:4])

	second, err := CompileDetailed(testKernels, "driver_test.cu", opts)
	require.NoError(t, err)
	require.True(t, second.CacheHit, "warm cache")
	require.Equal(t, first.Cubin, second.Cubin)
	require.Equal(t, first.CachePath, second.CachePath)

	other, err := CompileDetailed(testKernels, "driver_test.cu", CompileOptions{Arch: "sm_90", CacheDir: dir, NoFMAD: true})
	require.NoError(t, err)
	require.False(t, other.CacheHit, "different options, different entry")
	require.NotEqual(t, first.CachePath, other.CachePath)

	entry, err := os.ReadFile(first.CachePath)
	require.NoError(t, err)
	entry[len(entry)/2] ^= 0xff
	require.NoError(t, os.WriteFile(first.CachePath, entry, 0o644))

	third, err := CompileDetailed(testKernels, "driver_test.cu", opts)
	require.NoError(t, err, "a corrupt entry is recompiled, never fatal")
	require.False(t, third.CacheHit)
	require.ErrorIs(t, third.CacheErr, errCorruptCacheEntry)
	require.ErrorContains(t, third.CacheErr, "checksum mismatch")

	fourth, err := CompileDetailed(testKernels, "driver_test.cu", opts)
	require.NoError(t, err)
	require.True(t, fourth.CacheHit, "the recompiled entry was written back")
	require.Equal(t, third.Cubin, fourth.Cubin)

	require.NoError(t, os.Chmod(first.CachePath, 0o000))
	if _, err := os.ReadFile(first.CachePath); err == nil {
		t.Log("running as root: unreadable-file case not testable, skipped")
	} else {
		fifth, err := CompileDetailed(testKernels, "driver_test.cu", opts)
		require.NoError(t, err, "an unreadable entry is recompiled")
		require.False(t, fifth.CacheHit)
		require.Error(t, fifth.CacheErr)
	}
}

// TestNoFMADReachesTheCompiler: the same a*b+c compiles to an fma without
// --fmad=false and to a separate mul and add with it.
func TestNoFMADReachesTheCompiler(t *testing.T) {
	requireNVRTC(t)
	src := `extern "C" __global__ void muladd(float* out, const float* a, const float* b, const float* c) {
	unsigned int i = threadIdx.x;
	out[i] = a[i] * b[i] + c[i];
}`
	fused, err := CompilePTX(src, "muladd.cu", CompileOptions{Arch: "sm_90"})
	require.NoError(t, err)
	require.Contains(t, fused, "fma.rn.f32")

	separate, err := CompilePTX(src, "muladd.cu", CompileOptions{Arch: "sm_90", NoFMAD: true})
	require.NoError(t, err)
	require.NotContains(t, separate, "fma.")
	require.Contains(t, separate, "mul.rn.f32")
	require.Contains(t, separate, "add.rn.f32")
}

// TestHeadersReachTheCompiler: a source includes an in-memory header (which
// includes another) by name; without it the include fails; a header named
// twice or without a name is refused before NVRTC runs.
func TestHeadersReachTheCompiler(t *testing.T) {
	requireNVRTC(t)
	src := "#include \"outer.h\"\nextern \"C\" __global__ void k(unsigned int* p) { p[0] = OUTER + INNER; }\n"
	hs := []Header{
		{"outer.h", "#include \"inner.h\"\n#define OUTER 0x5a000000u\n"},
		{"inner.h", "#define INNER 0x00a5u\n"},
	}
	ptx, err := CompilePTX(src, "k.cu", CompileOptions{Arch: "sm_90", Headers: hs})
	require.NoError(t, err)
	require.Contains(t, ptx, "1509949605", "0x5a0000a5, the sum of the two headers' constants")

	_, err = CompilePTX(src, "k.cu", CompileOptions{Arch: "sm_90"})
	var ce *CompileError
	require.ErrorAs(t, err, &ce)
	require.Contains(t, ce.Log, "outer.h")

	_, err = CompilePTX(src, "k.cu", CompileOptions{Arch: "sm_90", Headers: append(hs, Header{"inner.h", ""})})
	require.ErrorContains(t, err, `CompileOptions.Headers: "inner.h" given twice`)
	_, err = Compile(src, "k.cu", CompileOptions{Arch: "sm_90", Headers: []Header{{"", "x"}}})
	require.ErrorContains(t, err, "CompileOptions.Headers: a header has no name")
}
