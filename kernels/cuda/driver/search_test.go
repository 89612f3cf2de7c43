package driver

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeEnvironment describes a machine by its environment variables and the
// paths (files and directories) that exist on it.
func fakeEnvironment(vars map[string]string, paths ...string) environment {
	return environment{
		getenv: func(k string) string { return vars[k] },
		glob: func(pattern string) ([]string, error) {
			var out []string
			for _, p := range paths {
				if ok, err := filepath.Match(pattern, p); err != nil {
					return nil, err
				} else if ok {
					out = append(out, p)
				}
			}
			return out, nil
		},
		exists: func(p string) bool { return slices.Contains(paths, p) },
	}
}

func TestNVRTCCandidates(t *testing.T) {
	sonames := []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}
	tests := []struct {
		name  string
		vars  map[string]string
		paths []string
		want  []string
	}{
		{
			name:  "explicit override is the only candidate",
			vars:  map[string]string{EnvNVRTC: "/opt/nvrtc/libnvrtc.so.13.0.48", "CUDA_HOME": "/opt/cuda"},
			paths: []string{"/opt/cuda/lib64/libnvrtc.so.13"},
			want:  []string{"/opt/nvrtc/libnvrtc.so.13.0.48"},
		},
		{
			name: "bare machine tries only the sonames",
			want: sonames,
		},
		{
			name: "toolkit: CUDA_HOME before /usr/local/cuda, newest version first, builtins ignored",
			vars: map[string]string{"CUDA_HOME": "/opt/cuda"},
			paths: []string{
				"/opt/cuda/lib64/libnvrtc.so", "/opt/cuda/lib64/libnvrtc.so.12", "/opt/cuda/lib64/libnvrtc.so.13.0.48",
				"/opt/cuda/lib64/libnvrtc-builtins.so.13.0",
				"/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13",
			},
			want: append(slices.Clone(sonames),
				"/opt/cuda/lib64/libnvrtc.so.13.0.48", "/opt/cuda/lib64/libnvrtc.so.12", "/opt/cuda/lib64/libnvrtc.so",
				"/usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so.13"),
		},
		{
			name: "versioned toolkits newest first",
			paths: []string{
				"/usr/local/cuda-12.8", "/usr/local/cuda-13.0", "/usr/local/cuda-12.10",
				"/usr/local/cuda-12.8/lib64/libnvrtc.so.12", "/usr/local/cuda-13.0/lib64/libnvrtc.so.13",
				"/usr/local/cuda-12.10/lib64/libnvrtc.so.12",
			},
			want: append(slices.Clone(sonames),
				"/usr/local/cuda-13.0/lib64/libnvrtc.so.13", "/usr/local/cuda-12.10/lib64/libnvrtc.so.12",
				"/usr/local/cuda-12.8/lib64/libnvrtc.so.12"),
		},
		{
			name: "python wheels: virtualenv, then pyenv, cu13 before cuda_nvrtc",
			vars: map[string]string{"VIRTUAL_ENV": "/srv/venv", "HOME": "/home/u"},
			paths: []string{
				"/srv/venv/lib/python3.12/site-packages",
				"/srv/venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
				"/srv/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"/home/u/.pyenv/versions/3.11.7",
				"/home/u/.pyenv/versions/3.11.7/lib/python3.11/site-packages",
				"/home/u/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
			},
			want: append(slices.Clone(sonames),
				"/srv/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13",
				"/srv/venv/lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
				"/home/u/.pyenv/versions/3.11.7/lib/python3.11/site-packages/nvidia/cu13/lib/libnvrtc.so.13"),
		},
		{
			name:  "system library directory last",
			paths: []string{"/usr/lib/x86_64-linux-gnu/libnvrtc.so.12"},
			want:  append(slices.Clone(sonames), "/usr/lib/x86_64-linux-gnu/libnvrtc.so.12"),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, nvrtcCandidates(fakeEnvironment(tc.vars, tc.paths...)))
		})
	}
}

func TestFindCUDAInclude(t *testing.T) {
	tests := []struct {
		name  string
		vars  map[string]string
		paths []string
		want  string
	}{
		{"override wins even over a toolkit", map[string]string{EnvCUDAInclude: "/inc", "CUDA_HOME": "/opt/cuda"},
			[]string{"/inc/cuda_bf16.h", "/opt/cuda/include/cuda_bf16.h"}, "/inc"},
		{"CUDA_HOME include", map[string]string{"CUDA_HOME": "/opt/cuda"},
			[]string{"/opt/cuda/include/cuda_bf16.h", "/usr/local/cuda/include/cuda_bf16.h"}, "/opt/cuda/include"},
		{"targets layout", nil, []string{"/usr/local/cuda/targets/x86_64-linux/include/cuda_bf16.h"},
			"/usr/local/cuda/targets/x86_64-linux/include"},
		{"runtime wheel", map[string]string{"VIRTUAL_ENV": "/v"}, []string{"/v/lib/python3.12/site-packages",
			"/v/lib/python3.12/site-packages/nvidia/cuda_runtime/include/cuda_bf16.h"},
			"/v/lib/python3.12/site-packages/nvidia/cuda_runtime/include"},
		{"debian toolkit", nil, []string{"/usr/include/cuda_bf16.h"}, "/usr/include"},
		{"a directory without cuda_bf16.h does not count", map[string]string{"CUDA_HOME": "/opt/cuda"},
			[]string{"/opt/cuda/include/cuda.h"}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir, searched := findCUDAInclude(fakeEnvironment(tc.vars, tc.paths...))
			require.Equal(t, tc.want, dir)
			if tc.want == "" {
				require.NotEmpty(t, searched, "a miss reports where it looked")
				require.Contains(t, searched, "/usr/local/cuda/include")
			}
		})
	}
}

func TestCompareVersionedDesc(t *testing.T) {
	tests := []struct {
		in   []string
		want []string
	}{
		{[]string{"libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13.0.48", "libnvrtc.so.13"},
			[]string{"libnvrtc.so.13.0.48", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"}},
		{[]string{"/usr/local/cuda-12.8", "/usr/local/cuda-12.10", "/usr/local/cuda-9.2"},
			[]string{"/usr/local/cuda-12.10", "/usr/local/cuda-12.8", "/usr/local/cuda-9.2"}},
		{[]string{"/x/lib/python3.9", "/x/lib/python3.12", "/x/lib/python3.10"},
			[]string{"/x/lib/python3.12", "/x/lib/python3.10", "/x/lib/python3.9"}},
	}
	for _, tc := range tests {
		got := slices.Clone(tc.in)
		slices.SortFunc(got, compareVersionedDesc)
		require.Equal(t, tc.want, got)
	}
}

func TestDriverCandidates(t *testing.T) {
	require.Equal(t, []string{"libcuda.so.1", "libcuda.so"}, driverCandidates(fakeEnvironment(nil)))
	require.Equal(t, []string{"/opt/compat/libcuda.so.1"},
		driverCandidates(fakeEnvironment(map[string]string{EnvLibCUDA: "/opt/compat/libcuda.so.1"})))
}
