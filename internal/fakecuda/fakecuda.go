package fakecuda

import (
	_ "embed"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
)

// Source is the C source of the fake libcuda.
//
//go:embed testdata/fakecuda.c
var Source string

const (
	// EnvActive is set to 1 in a process whose libcuda is the fake.
	EnvActive = "PROLOGUE_FAKE_DRIVER"
	// envLibCUDA is driver.EnvLibCUDA (this package cannot import the
	// driver, whose tests import it): the exact libcuda path to load.
	envLibCUDA = "PROLOGUE_LIBCUDA"
)

// Active reports whether this process runs against the fake.
func Active() bool { return os.Getenv(EnvActive) == "1" }

// Build compiles the fake into dir/libcuda.so.1 with the first C compiler
// on PATH (cc, gcc, clang) and returns its path.
func Build(dir string) (string, error) {
	cc := ""
	for _, name := range []string{"cc", "gcc", "clang"} {
		if p, err := exec.LookPath(name); err == nil {
			cc = p
			break
		}
	}
	if cc == "" {
		return "", errors.New("fakecuda: no C compiler (cc, gcc, clang) on PATH to build the fake libcuda")
	}
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, []byte(Source), 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, "libcuda.so.1")
	if out, err := exec.Command(cc, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", lib, src).CombinedOutput(); err != nil {
		return "", errors.New("fakecuda: building the fake libcuda: " + err.Error() + "\n" + string(out))
	}
	return lib, nil
}

var (
	useOnce sync.Once
	useErr  error
)

// Use selects the fake as this process's libcuda, building it once into a
// temporary directory, unless PROLOGUE_LIBCUDA already names a library (a
// real driver, for a benchmark on a GPU machine). It must run before the
// process's first driver call, which loads the library for good.
func Use() error {
	useOnce.Do(func() {
		if os.Getenv(envLibCUDA) != "" {
			return
		}
		dir, err := os.MkdirTemp("", "fakecuda")
		if err != nil {
			useErr = err
			return
		}
		lib, err := Build(dir)
		if err != nil {
			useErr = err
			return
		}
		useErr = errors.Join(os.Setenv(envLibCUDA, lib), os.Setenv(EnvActive, "1"))
	})
	return useErr
}

// RunChild builds the fake and reruns the test binary in a child process
// with it as libcuda, running the tests that match pattern (-test.run) in
// verbose mode; extraEnv entries (KEY=value) are added to the child's
// environment. It fails t if the child fails and returns its output. It
// skips under -short, without a C compiler, and in a child already
// running against the fake.
func RunChild(t *testing.T, pattern string, extraEnv ...string) string {
	t.Helper()
	if Active() {
		t.Skip("this process already runs against the fake driver")
	}
	if testing.Short() {
		t.Skip("builds a C library and runs a child test process")
	}
	lib, err := Build(t.TempDir())
	if err != nil {
		t.Skip(err.Error())
	}
	child := exec.Command(os.Args[0], "-test.run", pattern, "-test.v", "-test.count=1")
	child.Env = append(append(os.Environ(), envLibCUDA+"="+lib, EnvActive+"=1"), extraEnv...)
	out, err := child.CombinedOutput()
	if err != nil {
		t.Fatalf("tests %s against the fake driver failed: %v\n%s", pattern, err, out)
	}
	return string(out)
}

// LayerSinkKernel is the fake's kernel with the signature of the prologue's
// fused layer kernels (two Params structs and an int); it runs nothing, so
// launching it times the host path alone.
const LayerSinkKernel = "prologue_layer_sink"

// ParamsSinkKernel is the fake's kernel with the signature of the
// prologue's KV and Q kernels (one Params struct); it runs nothing.
const ParamsSinkKernel = "prologue_params_sink"

// ClusterEchoKernel is the fake's host version of the driver tests'
// cluster_echo(unsigned int* out): the block of linear index b writes the
// cluster shape it was launched in to out[4b..4b+2] and its successor's
// rank in the cluster ((rank + 1) mod the cluster's size) to out[4b+3], so
// a caller's cluster launch can be checked without a GPU.
const ClusterEchoKernel = "cluster_echo"

// LayerSinkParamsBytes is the size of one Params struct as the fake copies
// it (its PARAMS_BYTES), to check against the kernels' ABI.
func LayerSinkParamsBytes() int {
	m := regexp.MustCompile(`#define PARAMS_BYTES (\d+)`).FindStringSubmatch(Source)
	if m == nil {
		panic("fakecuda: testdata/fakecuda.c defines no PARAMS_BYTES")
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		panic(err)
	}
	return n
}

// ModuleImage is an image the fake's cuModuleLoadData accepts (it checks
// the ELF magic only); its module holds every fake kernel.
func ModuleImage() []byte { return []byte("\x7fELF fake module") }
