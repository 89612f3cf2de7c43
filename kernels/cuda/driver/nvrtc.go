package driver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// nvrtcAPI is the subset of libnvrtc this package calls (nvrtc.h, CUDA
// 12.x/13.0).
type nvrtcAPI struct {
	path         string
	major, minor int

	nvrtcVersion        func(major, minor *int32) NVRTCResult
	nvrtcGetErrorString func(r NVRTCResult) string // const char* nvrtcGetErrorString(nvrtcResult)
	// nvrtcCreateProgram(nvrtcProgram*, const char* src, const char* name, int numHeaders,
	//                    const char* const* headers, const char* const* includeNames)
	nvrtcCreateProgram     func(prog *handle, src, name *byte, numHeaders int32, headers, includeNames unsafe.Pointer) NVRTCResult
	nvrtcCompileProgram    func(prog handle, numOptions int32, options unsafe.Pointer) NVRTCResult
	nvrtcGetProgramLogSize func(prog handle, size *uint64) NVRTCResult
	nvrtcGetProgramLog     func(prog handle, log *byte) NVRTCResult
	nvrtcGetCUBINSize      func(prog handle, size *uint64) NVRTCResult
	nvrtcGetCUBIN          func(prog handle, cubin *byte) NVRTCResult
	nvrtcGetPTXSize        func(prog handle, size *uint64) NVRTCResult
	nvrtcGetPTX            func(prog handle, ptx *byte) NVRTCResult
	nvrtcDestroyProgram    func(prog *handle) NVRTCResult
}

func (n *nvrtcAPI) bindings() []binding {
	req := func(fptr any, name string) binding { return binding{fptr: fptr, names: []string{name}} }
	return []binding{
		req(&n.nvrtcVersion, "nvrtcVersion"),
		req(&n.nvrtcGetErrorString, "nvrtcGetErrorString"),
		req(&n.nvrtcCreateProgram, "nvrtcCreateProgram"),
		req(&n.nvrtcCompileProgram, "nvrtcCompileProgram"),
		req(&n.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
		req(&n.nvrtcGetProgramLog, "nvrtcGetProgramLog"),
		req(&n.nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
		req(&n.nvrtcGetCUBIN, "nvrtcGetCUBIN"),
		req(&n.nvrtcGetPTXSize, "nvrtcGetPTXSize"),
		req(&n.nvrtcGetPTX, "nvrtcGetPTX"),
		req(&n.nvrtcDestroyProgram, "nvrtcDestroyProgram"),
	}
}

func (n *nvrtcAPI) check(call string, r NVRTCResult) error {
	if r == NVRTCSuccess {
		return nil
	}
	name := n.nvrtcGetErrorString(r)
	if name == "" {
		name = r.Name()
	}
	return &NVRTCError{Call: call, Result: r, Name: name}
}

var (
	nvrtcOnce   sync.Once
	nvrtcLoaded *nvrtcAPI
	nvrtcErr    error
	nvrtcMu     sync.Mutex // serializes compilations; NVRTC is not hot
)

func loadNVRTC() (*nvrtcAPI, error) {
	nvrtcOnce.Do(func() {
		h, path, err := openFirst("NVRTC (set "+EnvNVRTC+" to its path)", nvrtcCandidates(processEnvironment()))
		if err != nil {
			nvrtcErr = err
			return
		}
		preloadBuiltins(path)
		n := &nvrtcAPI{path: path}
		if err := bindAll(h, path, n.bindings()); err != nil {
			nvrtcErr = err
			return
		}
		var major, minor int32
		if err := n.check("nvrtcVersion", n.nvrtcVersion(&major, &minor)); err != nil {
			nvrtcErr = err
			return
		}
		n.major, n.minor = int(major), int(minor)
		nvrtcLoaded = n
	})
	return nvrtcLoaded, nvrtcErr
}

// preloadBuiltins loads libnvrtc-builtins from the directory NVRTC came
// from. NVRTC dlopens it by soname at compile time; when that directory is
// not on the loader path the lookup would fail, but a library already loaded
// under the same soname satisfies it.
func preloadBuiltins(nvrtcPath string) {
	if !strings.Contains(nvrtcPath, "/") {
		return
	}
	found, _ := filepath.Glob(filepath.Join(filepath.Dir(nvrtcPath), "libnvrtc-builtins.so*"))
	slices.SortFunc(found, compareVersionedDesc)
	for _, p := range found {
		if _, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err == nil {
			return
		}
	}
}

// NVRTCAvailable reports whether NVRTC loads; the error lists every path
// tried and why each failed.
func NVRTCAvailable() error {
	_, err := loadNVRTC()
	if err != nil {
		return fmt.Errorf("NVRTC unavailable: %w", err)
	}
	return nil
}

// NVRTCVersion is the loaded NVRTC's version and library path.
func NVRTCVersion() (major, minor int, path string, err error) {
	n, err := loadNVRTC()
	if err != nil {
		return 0, 0, "", fmt.Errorf("NVRTC unavailable: %w", err)
	}
	return n.major, n.minor, n.path, nil
}

// FindCUDAInclude returns a directory holding the CUDA headers
// (cuda_bf16.h, cuda_fp8.h) for NVRTC's -I, searching $PROLOGUE_CUDA_INCLUDE,
// the toolkit roots ($CUDA_HOME, $CUDA_PATH, /usr/local/cuda*), the nvidia
// Python wheels and /usr/include.
func FindCUDAInclude() (string, error) {
	dir, searched := findCUDAInclude(processEnvironment())
	if dir == "" {
		return "", fmt.Errorf("no CUDA include directory with cuda_bf16.h; searched %s (set %s)", strings.Join(searched, ", "), EnvCUDAInclude)
	}
	return dir, nil
}

// CompileOptions controls an NVRTC compilation. The zero value plus an Arch
// is a complete configuration.
type CompileOptions struct {
	// Arch is the real architecture, e.g. "sm_90" or "sm_90a". Context.Compile
	// fills it from the device when empty.
	Arch string
	// NoFMAD passes --fmad=false so the compiler never contracts a*b+c into
	// a fused multiply-add. Kernels that spell out __fmul_rn/__fadd_rn do not
	// need it, but it is a cheap guard for bit-exact code.
	NoFMAD bool
	// Defines become -DNAME=VALUE (or -DNAME when VALUE is empty), in name order.
	Defines map[string]string
	// IncludeDirs become -I options, in order.
	IncludeDirs []string
	// CUDAIncludes adds the CUDA include directory (FindCUDAInclude) for
	// sources that include cuda_bf16.h, cuda_fp8.h and friends.
	CUDAIncludes bool
	// Extra options are passed through verbatim, last.
	Extra []string
	// Headers are in-memory files the source may #include by name
	// (nvrtcCreateProgram's headers and includeNames): NVRTC looks them up
	// before any include directory. They are part of the cache key.
	Headers []Header
	// CacheDir overrides $PROLOGUE_CACHE_DIR and the default cache directory.
	CacheDir string
	// NoCache compiles without reading or writing the cubin cache.
	NoCache bool
}

// Header is one in-memory include file: `#include "Name"` reads Source.
type Header struct {
	Name, Source string
}

// validateHeaders refuses an empty or repeated name: NVRTC would take one
// of two texts of a name without saying which.
func validateHeaders(hs []Header) error {
	seen := make(map[string]bool, len(hs))
	for _, h := range hs {
		if h.Name == "" {
			return errors.New("CompileOptions.Headers: a header has no name")
		}
		if seen[h.Name] {
			return fmt.Errorf("CompileOptions.Headers: %q given twice", h.Name)
		}
		seen[h.Name] = true
	}
	return nil
}

var (
	archPattern   = regexp.MustCompile(`^sm_[0-9]{2,3}[af]?$`)
	definePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// nvrtcOptions is the full NVRTC option list for o with the given
// architecture option value (sm_XY for CUBIN, compute_XY for PTX).
func (o CompileOptions) nvrtcOptions(archOption string, env environment) ([]string, error) {
	opts := []string{"--gpu-architecture=" + archOption, "-std=c++17", "-default-device"}
	if o.NoFMAD {
		opts = append(opts, "--fmad=false")
	}
	names := make([]string, 0, len(o.Defines))
	for name := range o.Defines {
		if !definePattern.MatchString(name) {
			return nil, fmt.Errorf("CompileOptions.Defines: name %q is not a C identifier", name)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if v := o.Defines[name]; v != "" {
			opts = append(opts, "-D"+name+"="+v)
		} else {
			opts = append(opts, "-D"+name)
		}
	}
	for _, d := range o.IncludeDirs {
		if d == "" {
			return nil, errors.New("CompileOptions.IncludeDirs: empty directory")
		}
		opts = append(opts, "-I"+d)
	}
	if o.CUDAIncludes {
		dir, searched := findCUDAInclude(env)
		if dir == "" {
			return nil, fmt.Errorf("CompileOptions.CUDAIncludes is set but no directory with cuda_bf16.h was found; searched %s (set %s)",
				strings.Join(searched, ", "), EnvCUDAInclude)
		}
		opts = append(opts, "-I"+dir)
	}
	if err := validateHeaders(o.Headers); err != nil {
		return nil, err
	}
	return append(opts, o.Extra...), nil
}

func validateProgram(src, program, arch string) error {
	if program == "" {
		return errors.New("Compile: program name is empty")
	}
	if strings.TrimSpace(src) == "" {
		return fmt.Errorf("Compile %q: source is empty", program)
	}
	if arch == "" {
		return fmt.Errorf("Compile %q: CompileOptions.Arch is empty; set it (e.g. \"sm_90\") or use Context.Compile", program)
	}
	if !archPattern.MatchString(arch) {
		return fmt.Errorf("Compile %q: CompileOptions.Arch %q is not a real architecture like \"sm_90\" or \"sm_90a\"", program, arch)
	}
	return nil
}

// Compiled is a compilation's result with its provenance.
type Compiled struct {
	Cubin     []byte
	Options   []string // the NVRTC options used
	Log       string   // NVRTC's log (warnings); empty on a cache hit
	CacheHit  bool     // Cubin came from the cache without compiling
	CachePath string   // the entry's path; empty when caching is off
	// CacheErr says why the cache could not be used (unreadable or corrupt
	// entry, unwritable directory). It is informational: the compile itself
	// succeeded.
	CacheErr error
}

// Compile compiles CUDA C++ src to a CUBIN for opts.Arch, using the cubin
// cache. Kernels should be declared `extern "C" __global__`.
func Compile(src, program string, opts CompileOptions) ([]byte, error) {
	c, err := CompileDetailed(src, program, opts)
	if err != nil {
		return nil, err
	}
	return c.Cubin, nil
}

// CompileDetailed is Compile, also reporting the options, log and cache use.
func CompileDetailed(src, program string, opts CompileOptions) (*Compiled, error) {
	if err := validateProgram(src, program, opts.Arch); err != nil {
		return nil, err
	}
	options, err := opts.nvrtcOptions(opts.Arch, processEnvironment())
	if err != nil {
		return nil, fmt.Errorf("Compile %q: %w", program, err)
	}
	n, err := loadNVRTC()
	if err != nil {
		return nil, fmt.Errorf("Compile %q: NVRTC unavailable: %w", program, err)
	}
	out := &Compiled{Options: options}
	if !opts.NoCache {
		dir := opts.CacheDir
		if dir == "" {
			dir, out.CacheErr = CacheDir()
		}
		if dir != "" {
			key := cacheKey(fmt.Sprintf("%d.%d", n.major, n.minor), program, src, options, opts.Headers)
			out.CachePath = filepath.Join(dir, key+".cubin")
			cubin, err := readCacheEntry(out.CachePath)
			if err == nil {
				out.Cubin, out.CacheHit = cubin, true
				return out, nil
			}
			if !errors.Is(err, os.ErrNotExist) {
				out.CacheErr = fmt.Errorf("cubin cache entry %s unusable, recompiling: %w", out.CachePath, err)
			}
		}
	}
	cubin, log, err := n.compile(src, program, options, opts.Headers, false)
	if err != nil {
		return nil, err
	}
	out.Cubin, out.Log = cubin, log
	if out.CachePath != "" {
		if err := writeCacheEntry(out.CachePath, cubin); err != nil {
			out.CacheErr = errors.Join(out.CacheErr, fmt.Errorf("write cubin cache entry: %w", err))
		}
	}
	return out, nil
}

// CompilePTX compiles src to PTX for the virtual architecture matching
// opts.Arch (sm_90 → compute_90), without the cache. It is for inspecting
// generated code, e.g. checking that no fma instruction appears.
func CompilePTX(src, program string, opts CompileOptions) (string, error) {
	if err := validateProgram(src, program, opts.Arch); err != nil {
		return "", err
	}
	options, err := opts.nvrtcOptions("compute_"+strings.TrimPrefix(opts.Arch, "sm_"), processEnvironment())
	if err != nil {
		return "", fmt.Errorf("CompilePTX %q: %w", program, err)
	}
	n, err := loadNVRTC()
	if err != nil {
		return "", fmt.Errorf("CompilePTX %q: NVRTC unavailable: %w", program, err)
	}
	ptx, _, err := n.compile(src, program, options, opts.Headers, true)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(ptx), "\x00"), nil
}

// compile runs one NVRTC program and returns the CUBIN (or PTX) and the log.
// headers are the in-memory include files.
func (n *nvrtcAPI) compile(src, program string, options []string, headers []Header, wantPTX bool) (image []byte, log string, err error) {
	nvrtcMu.Lock()
	defer nvrtcMu.Unlock()
	var pin runtime.Pinner
	defer pin.Unpin()

	csrc := append([]byte(src), 0)
	cname := append([]byte(program), 0)
	pin.Pin(&csrc[0])
	pin.Pin(&cname[0])
	var hdrs, names unsafe.Pointer
	if len(headers) > 0 {
		texts := make([]string, len(headers))
		incl := make([]string, len(headers))
		for i, h := range headers {
			texts[i], incl[i] = h.Source, h.Name
		}
		tbufs, tptrs := cStrings(texts)
		nbufs, nptrs := cStrings(incl)
		for i := range tbufs {
			pin.Pin(&tbufs[i][0])
			pin.Pin(&nbufs[i][0])
		}
		pin.Pin(&tptrs[0])
		pin.Pin(&nptrs[0])
		hdrs, names = unsafe.Pointer(&tptrs[0]), unsafe.Pointer(&nptrs[0])
	}
	var prog handle
	if err := n.check("nvrtcCreateProgram", n.nvrtcCreateProgram(&prog, &csrc[0], &cname[0], int32(len(headers)), hdrs, names)); err != nil {
		return nil, "", fmt.Errorf("compile %q: %w", program, err)
	}
	defer n.nvrtcDestroyProgram(&prog)

	bufs, ptrs := cStrings(options)
	var optionArray unsafe.Pointer
	if len(ptrs) > 0 {
		for _, b := range bufs {
			pin.Pin(&b[0])
		}
		pin.Pin(&ptrs[0])
		optionArray = unsafe.Pointer(&ptrs[0])
	}
	compileErr := n.check("nvrtcCompileProgram", n.nvrtcCompileProgram(prog, int32(len(ptrs)), optionArray))
	log, logErr := n.programLog(prog)
	if compileErr != nil {
		if logErr != nil {
			log = "(log unavailable: " + logErr.Error() + ")"
		}
		return nil, "", &CompileError{Program: program, Options: options, Log: log, Err: compileErr}
	}

	sizeFn, getFn, what := n.nvrtcGetCUBINSize, n.nvrtcGetCUBIN, "CUBIN"
	if wantPTX {
		sizeFn, getFn, what = n.nvrtcGetPTXSize, n.nvrtcGetPTX, "PTX"
	}
	var size uint64
	if err := n.check("nvrtcGet"+what+"Size", sizeFn(prog, &size)); err != nil {
		return nil, "", fmt.Errorf("compile %q: %w", program, err)
	}
	if size == 0 {
		return nil, "", fmt.Errorf("compile %q: NVRTC produced an empty %s for options %q", program, what, options)
	}
	image = make([]byte, size)
	pin.Pin(&image[0])
	if err := n.check("nvrtcGet"+what, getFn(prog, &image[0])); err != nil {
		return nil, "", fmt.Errorf("compile %q: %w", program, err)
	}
	return image, log, nil
}

// programLog fetches the compiler log without its trailing NUL.
func (n *nvrtcAPI) programLog(prog handle) (string, error) {
	var size uint64
	if err := n.check("nvrtcGetProgramLogSize", n.nvrtcGetProgramLogSize(prog, &size)); err != nil {
		return "", err
	}
	if size <= 1 {
		return "", nil
	}
	buf := make([]byte, size)
	var pin runtime.Pinner
	defer pin.Unpin()
	pin.Pin(&buf[0])
	if err := n.check("nvrtcGetProgramLog", n.nvrtcGetProgramLog(prog, &buf[0])); err != nil {
		return "", err
	}
	return strings.TrimRight(string(buf), "\x00"), nil
}

// Compile compiles for this context's device: opts.Arch defaults to the
// device's sm_XY.
func (c *Context) Compile(src, program string, opts CompileOptions) ([]byte, error) {
	if opts.Arch == "" {
		opts.Arch = c.props.Arch()
	}
	return Compile(src, program, opts)
}

// CompileModule compiles (or fetches from the cache) and loads src. If a
// cached image fails to load it is discarded and recompiled once, so a bad
// cache entry can never wedge a program.
func (c *Context) CompileModule(src, program string, opts CompileOptions) (*Module, error) {
	if opts.Arch == "" {
		opts.Arch = c.props.Arch()
	}
	compiled, err := CompileDetailed(src, program, opts)
	if err != nil {
		return nil, err
	}
	m, err := c.LoadModule(compiled.Cubin)
	if err == nil || !compiled.CacheHit {
		return m, err
	}
	os.Remove(compiled.CachePath)
	compiled, err = CompileDetailed(src, program, opts)
	if err != nil {
		return nil, err
	}
	return c.LoadModule(compiled.Cubin)
}
