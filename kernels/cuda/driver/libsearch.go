package driver

import (
	"path/filepath"
	"slices"
)

// LibrarySpec describes a CUDA toolkit library for LibraryCandidates, so
// that libraries other packages bind (cuBLASLt) are found the way NVRTC is.
type LibrarySpec struct {
	// Env names the variable whose value, when set, is the only candidate.
	Env string
	// Sonames are tried first, through the dynamic loader's own search.
	Sonames []string
	// Glob matches the library's files in a directory, e.g. "libcublasLt.so*".
	Glob string
	// Wheels are the nvidia-* Python wheel directories under nvidia/ that
	// may hold it, e.g. "cublas" (nvidia/cublas/lib); the CUDA 13 "cu13"
	// layout is always searched.
	Wheels []string
}

// LibraryCandidates lists the paths to try for spec, in order: the
// override alone when set; else the sonames, then the CUDA toolkit roots'
// lib64, lib and targets/x86_64-linux/lib (CUDA_HOME, CUDA_PATH,
// CUDA_ROOT, /usr/local/cuda, /usr/local/cuda-* newest first), the Python
// wheels' lib directories, and the system library directories; within a
// directory, higher versions first.
func LibraryCandidates(spec LibrarySpec) []string {
	return libraryCandidates(processEnvironment(), spec)
}

func libraryCandidates(env environment, spec LibrarySpec) []string {
	if spec.Env != "" {
		if p := env.getenv(spec.Env); p != "" {
			return []string{p}
		}
	}
	candidates := append([]string(nil), spec.Sonames...)
	var dirs []string
	for _, root := range toolkitRoots(env) {
		dirs = append(dirs, filepath.Join(root, "lib64"), filepath.Join(root, "lib"),
			filepath.Join(root, "targets", "x86_64-linux", "lib"))
	}
	for _, site := range pythonPackageDirs(env) {
		dirs = append(dirs, filepath.Join(site, "nvidia", "cu13", "lib"))
		for _, w := range spec.Wheels {
			dirs = append(dirs, filepath.Join(site, "nvidia", w, "lib"))
		}
	}
	dirs = append(dirs, "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
	for _, d := range dirs {
		found, _ := env.glob(filepath.Join(d, spec.Glob))
		slices.SortFunc(found, compareVersionedDesc)
		candidates = append(candidates, found...)
	}
	return dedupe(candidates)
}

// OpenLibrary dlopens the first loadable candidate; the error lists every
// candidate with the loader's reason.
func OpenLibrary(what string, candidates []string) (handle uintptr, path string, err error) {
	return openFirst(what, candidates)
}

// Handle is the raw CUstream (the same handle as a cudaStream_t) for
// libraries that enqueue work themselves, such as cuBLASLt; 0, the legacy
// default stream, for a nil Stream. Use it only on the Context's owner
// goroutine (inside Do), and not after Destroy.
func (s *Stream) Handle() uintptr { return s.raw() }
