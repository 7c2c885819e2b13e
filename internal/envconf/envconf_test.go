package envconf

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
	"github.com/gorun/gorun/collective/algo"
	"github.com/gorun/gorun/kernels/cpu"
	"github.com/gorun/gorun/kernels/cuda"
	"github.com/gorun/gorun/kernels/device"
	"github.com/gorun/gorun/rank"
)

func lookup(env map[string]string) Lookup {
	return func(name string) (string, bool) { v, ok := env[name]; return v, ok }
}

// Every collective variable reaches its Config field; unset ones leave
// the zero value (the library's default); a malformed one is an error
// naming it.
func TestCollective(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want collective.Config
		err  string
	}{
		{env: nil},
		{env: map[string]string{Allreduce: "tree"}, want: collective.Config{Algorithm: algo.Tree}},
		{env: map[string]string{Allreduce: "hd"}, want: collective.Config{Algorithm: algo.HalvingDoubling}},
		{env: map[string]string{Allreduce: ""}, want: collective.Config{Algorithm: algo.Auto}},
		{env: map[string]string{Allreduce: "butterfly"}, err: "GORUN_ALLREDUCE: unknown allreduce algorithm \"butterfly\""},
		{env: map[string]string{SliceBytes: "4096", Rings: "3"}, want: collective.Config{SliceBytes: 4096, Channels: 3}},
		{env: map[string]string{SliceBytes: "12x"}, err: `GORUN_SLICE_BYTES="12x": want an integer >= 64`},
		{env: map[string]string{SliceBytes: "8"}, err: `GORUN_SLICE_BYTES="8": want an integer >= 64`},
		{env: map[string]string{Rings: "0"}, err: `GORUN_RINGS="0": want an integer >= 1`},
		{env: map[string]string{Hierarchical: "0"}, want: collective.Config{Flat: true}},
		{env: map[string]string{Hierarchical: "1"}},
		{env: map[string]string{SharedRound: "65536"}, want: collective.Config{SharedRoundBytes: 65536}},
		{env: map[string]string{SharedRound: "100"}},
		{env: map[string]string{SharedRound: "lots"}},
	} {
		got, err := Collective(lookup(c.env))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: want an error %q, got %v", c.env, c.err, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: got %+v, %v; want %+v", c.env, got, err, c.want)
		}
	}
}

// Every variable of the CUDA backend and the device choice reaches its
// Settings field; unset ones leave the zero value; GORUN_CUDA_PROFILE and
// GORUN_CUDA_EXACT_ALLOC other than 1, 0 or empty are errors naming them.
func TestDevice(t *testing.T) {
	all := map[string]string{cuda.EnvLibDir: "/emu", CUDAHome: "/cuda-12", CUDAPath: "/cuda", VirtualEnv: "/venv",
		CondaPrefix: "/conda", PythonPath: "/a:/b", cuda.EnvVisibleDevices: "3,1", cuda.EnvProfile: "1",
		cuda.EnvExactAlloc: "1", cpu.EnvSgemmKernel: "go", rank.EnvLocalRank: "2"}
	allSet := device.Settings{SgemmKernel: "go", LocalRank: 2, CUDA: cuda.Settings{LibDir: "/emu", CUDAHome: "/cuda-12",
		CUDAPath: "/cuda", VirtualEnv: "/venv", CondaPrefix: "/conda", PythonPath: "/a:/b", VisibleDevices: "3,1",
		ExactAlloc: true, Profile: true}}
	for _, c := range []struct {
		env  map[string]string
		want device.Settings
		err  string
	}{
		{env: nil},
		{env: all, want: allSet},
		{env: map[string]string{cuda.EnvProfile: "0", cuda.EnvExactAlloc: ""}},
		{env: map[string]string{cuda.EnvProfile: "yes"},
			err: `cuda: GORUN_CUDA_PROFILE="yes": want 1 (time every operation on the GPU) or 0`},
		{env: map[string]string{cuda.EnvExactAlloc: "2"},
			err: `cuda: GORUN_CUDA_EXACT_ALLOC="2": want 1 (every allocation its exact size, every Free to the driver) or 0`},
		// set but empty: the best kernel, not the one chosen before
		{env: map[string]string{cpu.EnvSgemmKernel: ""}, want: device.Settings{SgemmKernel: "auto"}},
		{env: map[string]string{rank.EnvLocalRank: "x"}},
	} {
		got, err := Device(lookup(c.env))
		if c.err != "" {
			if err == nil || err.Error() != c.err {
				t.Errorf("%v: want the error %q, got %v", c.env, c.err, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: got %+v, %v; want %+v", c.env, got, err, c.want)
		}
		if cs, err := CUDA(lookup(c.env)); err != nil || cs != c.want.CUDA {
			t.Errorf("%v: CUDA got %+v, %v; want %+v", c.env, cs, err, c.want.CUDA)
		}
	}
}
