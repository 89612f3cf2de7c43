package driver

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Environment variables that steer library and header discovery.
const (
	EnvLibCUDA     = "PROLOGUE_LIBCUDA"      // exact path of libcuda to load; no other is tried
	EnvNVRTC       = "PROLOGUE_NVRTC"        // exact path of libnvrtc to load; no other is tried
	EnvCUDAInclude = "PROLOGUE_CUDA_INCLUDE" // exact CUDA include dir; no other is tried
	EnvCacheDir    = "PROLOGUE_CACHE_DIR"    // cubin cache directory
)

// driverCandidates lists the libcuda paths to try. The driver API lives in
// the display driver's libcuda, found through the dynamic loader's normal
// search (LD_LIBRARY_PATH, the ld.so cache), never in the toolkit; the
// toolkit's stubs/libcuda.so would only answer CUDA_ERROR_STUB_LIBRARY.
// PROLOGUE_LIBCUDA, when set, is the only candidate (a forward-compatibility
// libcuda, or a test double).
func driverCandidates(env environment) []string {
	if p := env.getenv(EnvLibCUDA); p != "" {
		return []string{p}
	}
	return []string{"libcuda.so.1", "libcuda.so"}
}

// environment is what library discovery reads from the process, abstracted so
// tests can describe a machine without having one.
type environment struct {
	getenv func(string) string
	glob   func(string) ([]string, error)
	exists func(string) bool
}

func processEnvironment() environment {
	return environment{
		getenv: os.Getenv,
		glob:   filepath.Glob,
		exists: func(p string) bool { _, err := os.Stat(p); return err == nil },
	}
}

// toolkitRoots are CUDA toolkit installation roots, most specific first.
func toolkitRoots(env environment) []string {
	var roots []string
	for _, v := range []string{"CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"} {
		if d := env.getenv(v); d != "" {
			roots = append(roots, d)
		}
	}
	roots = append(roots, "/usr/local/cuda")
	versioned, _ := env.glob("/usr/local/cuda-*")
	slices.SortFunc(versioned, compareVersionedDesc)
	return append(roots, versioned...)
}

// pythonPackageDirs are site-packages/dist-packages directories where the
// nvidia-* wheels (nvidia-cuda-nvrtc, nvidia-cuda-runtime, the CUDA 13
// "cu13" layout) may have put libraries and headers.
func pythonPackageDirs(env environment) []string {
	var prefixes []string
	for _, v := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if d := env.getenv(v); d != "" {
			prefixes = append(prefixes, d)
		}
	}
	if home := env.getenv("HOME"); home != "" {
		prefixes = append(prefixes, filepath.Join(home, ".local"))
		pyenv, _ := env.glob(filepath.Join(home, ".pyenv", "versions", "*"))
		prefixes = append(prefixes, pyenv...)
	}
	prefixes = append(prefixes, "/usr/local", "/usr", "/opt/conda")
	var dirs []string
	for _, p := range prefixes {
		for _, kind := range []string{"site-packages", "dist-packages"} {
			found, _ := env.glob(filepath.Join(p, "lib", "python3*", kind))
			slices.SortFunc(found, compareVersionedDesc)
			dirs = append(dirs, found...)
		}
	}
	// Debian's system python keeps packages in an unversioned directory.
	return append(dirs, "/usr/lib/python3/dist-packages")
}

// nvrtcCandidates lists the libnvrtc paths to try, in order. With
// PROLOGUE_NVRTC set, that path is the only candidate: an explicit choice that
// fails must say so rather than silently load another copy.
func nvrtcCandidates(env environment) []string {
	if p := env.getenv(EnvNVRTC); p != "" {
		return []string{p}
	}
	// Bare sonames go through the loader's own search first.
	candidates := []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}
	var dirs []string
	for _, root := range toolkitRoots(env) {
		dirs = append(dirs, filepath.Join(root, "lib64"), filepath.Join(root, "lib"),
			filepath.Join(root, "targets", "x86_64-linux", "lib"))
	}
	for _, site := range pythonPackageDirs(env) {
		dirs = append(dirs, filepath.Join(site, "nvidia", "cu13", "lib"),
			filepath.Join(site, "nvidia", "cuda_nvrtc", "lib"))
	}
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
	for _, d := range dirs {
		found, _ := env.glob(filepath.Join(d, "libnvrtc.so*"))
		slices.SortFunc(found, compareVersionedDesc)
		candidates = append(candidates, found...)
	}
	return dedupe(candidates)
}

// includeCandidates lists directories that may hold the CUDA headers NVRTC
// needs for cuda_bf16.h / cuda_fp8.h. PROLOGUE_CUDA_INCLUDE, when set, is the
// only candidate.
func includeCandidates(env environment) []string {
	if p := env.getenv(EnvCUDAInclude); p != "" {
		return []string{p}
	}
	var dirs []string
	for _, root := range toolkitRoots(env) {
		dirs = append(dirs, filepath.Join(root, "include"), filepath.Join(root, "targets", "x86_64-linux", "include"))
	}
	for _, site := range pythonPackageDirs(env) {
		dirs = append(dirs, filepath.Join(site, "nvidia", "cu13", "include"),
			filepath.Join(site, "nvidia", "cuda_runtime", "include"))
	}
	dirs = append(dirs, "/usr/include")
	return dedupe(dirs)
}

// findCUDAInclude returns the first candidate directory holding cuda_bf16.h,
// or the list searched when none does.
func findCUDAInclude(env environment) (string, []string) {
	candidates := includeCandidates(env)
	for _, d := range candidates {
		if env.exists(filepath.Join(d, "cuda_bf16.h")) {
			return d, nil
		}
	}
	return "", candidates
}

// compareVersionedDesc orders paths so that higher trailing version numbers
// come first ("libnvrtc.so.13.0.48" before "libnvrtc.so.12", "cuda-13.0"
// before "cuda-12.8", "python3.12" before "python3.9"); an unversioned name
// sorts after its versioned siblings.
func compareVersionedDesc(a, b string) int {
	va, vb := trailingVersion(a), trailingVersion(b)
	for i := 0; i < len(va) || i < len(vb); i++ {
		x, y := -1, -1
		if i < len(va) {
			x = va[i]
		}
		if i < len(vb) {
			y = vb[i]
		}
		if x != y {
			return y - x
		}
	}
	return strings.Compare(a, b)
}

// trailingVersion extracts the dotted numbers after the last ".so", "cuda-"
// or "python" marker in the base name, e.g. [13 0 48] from
// "libnvrtc.so.13.0.48".
func trailingVersion(path string) []int {
	base := filepath.Base(path)
	rest := ""
	for _, marker := range []string{".so.", "cuda-", "python"} {
		if i := strings.LastIndex(base, marker); i >= 0 {
			rest = base[i+len(marker):]
			break
		}
	}
	var v []int
	for _, part := range strings.Split(rest, ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			break
		}
		v = append(v, n)
	}
	return v
}

func dedupe(items []string) []string {
	seen := make(map[string]bool, len(items))
	out := items[:0:0]
	for _, it := range items {
		if !seen[it] {
			seen[it] = true
			out = append(out, it)
		}
	}
	return out
}
