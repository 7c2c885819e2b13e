package openseq2seq

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	def := func(f func(*Args)) Args {
		a := Args{Mode: "train", InferOutputFile: "infer-out.txt", BenchSteps: 20, ConfigFile: "c.py"}
		f(&a)
		return a
	}
	cases := []struct {
		name string
		args string // split on spaces
		want Args
	}{
		{"the lab's command line", "--config_file=transformer-base.py --mode=train_eval --use_horovod=True --logdir=D",
			def(func(a *Args) {
				a.ConfigFile, a.Mode = "transformer-base.py", "train_eval"
				a.Overrides = []string{"--use_horovod=True", "--logdir=D"}
			})},
		{"defaults", "--config_file=c.py", def(func(*Args) {})},
		{"flag value", "--config_file c.py --mode eval --infer_output_file out.txt",
			def(func(a *Args) { a.Mode, a.InferOutputFile = "eval", "out.txt" })},
		{"bool flags", "--config_file=c.py --continue_learning --no_dir_check --benchmark --enable_logs --bench_steps=5 --bench_start 2",
			def(func(a *Args) {
				a.ContinueLearning, a.NoDirCheck, a.Benchmark, a.EnableLogs = true, true, true, true
				a.BenchSteps, a.BenchStart = 5, 2
			})},
		{"argparse prefixes", "--config=c.py --mo=infer --cont", def(func(a *Args) { a.Mode, a.ContinueLearning = "infer", true })},
		{"override with a separate value", "--config_file=c.py --batch_size_per_gpu 64 --lr_policy_params/learning_rate -0.5",
			def(func(a *Args) {
				a.Overrides = []string{"--batch_size_per_gpu=64", "--lr_policy_params/learning_rate=-0.5"}
			})},
		{"override without a value", "--config_file=c.py --use_horovod --mode=eval",
			def(func(a *Args) { a.Mode, a.Overrides = "eval", []string{"--use_horovod"} })},
		{"last one wins", "--config_file=a.py --config_file=c.py --mode=eval --mode=infer", def(func(a *Args) { a.Mode = "infer" })},
		{"xla and trt precision: notes", "--config_file=c.py --use_xla_jit --precision=fp16",
			def(func(a *Args) {
				a.UseXLAJit = true
				a.Notes = []string{
					"--use_xla_jit: no effect (XLA is TensorFlow's compiler; gorun runs its own kernels)",
					"--precision=fp16: no effect (run.py's TensorRT precision, used only with --use_trt; gorun's precision follows the config's dtype)",
				}
			})},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseArgs(strings.Fields(c.args))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Errorf("got  %+v\nwant %+v", got, c.want)
			}
		})
	}
}

func TestParseArgsErrors(t *testing.T) {
	cases := []struct{ args, want string }{
		{"--mode=train", "command line: the following arguments are required: --config_file"},
		{"--config_file=c.py --mode=predict", "command line: --mode=predict: want train, eval, train_eval or infer"},
		{"--config_file=c.py --mode=interactive_infer", "command line: --mode=interactive_infer: gorun has no interactive inference (run.py refuses it too: it is meant for a notebook)"},
		{"--config_file", "command line: argument --config_file: expected one argument"},
		{"--config_file --mode=eval", "command line: argument --config_file: expected one argument"},
		{"--config_file=c.py --benchmark=1", "command line: argument --benchmark: ignored explicit argument \"1\" (it takes no value)"},
		{"--config_file=c.py --bench_steps=x", "command line: argument --bench_steps: invalid int value: \"x\""},
		{"--config_file=c.py --bench=1", "command line: ambiguous option: --bench could match --benchmark, --bench_steps, --bench_start"},
		{"--config_file=c.py stray", "command line: unrecognized argument \"stray\" (run.py takes --flag=value and --KEY=VALUE; see --help)"},
		{"--config_file=c.py -x", "command line: unrecognized argument \"-x\" (run.py takes --flag=value and --KEY=VALUE; see --help)"},
		{"--config_file=c.py --debug_port=6064", "command line: --debug_port: gorun has no TensorFlow debugger (remove it to run)"},
		{"--config_file=c.py --use_trt", "command line: --use_trt: gorun has no TensorRT (remove it to run)"},
		{"--config_file=c.py --precision=fp64", "command line: argument --precision: invalid choice: \"fp64\" (choose from 'fp32', 'fp16', 'int8')"},
		{"--config_file=c.py --benchmark --bench_steps=0", "command line: --bench_steps=0: want at least 1"},
	}
	for _, c := range cases {
		_, err := ParseArgs(strings.Fields(c.args))
		if err == nil || err.Error() != c.want {
			t.Errorf("%s:\n got  %v\n want %s", c.args, err, c.want)
		}
	}
	for _, h := range []string{"-h", "--help"} {
		if _, err := ParseArgs([]string{"--mode=bad", h}); !errors.Is(err, ErrHelp) {
			t.Errorf("%s: %v, want ErrHelp", h, err)
		}
	}
	for _, f := range runFlags {
		if !strings.Contains(Usage, "--"+f.name) {
			t.Errorf("Usage does not list --%s", f.name)
		}
	}
}

// TestArgsThenLoad runs the lab's command line through ParseArgs and Load.
func TestArgsThenLoad(t *testing.T) {
	a, err := ParseArgs([]string{"--config_file=testdata/lab-transformer-base.py", "--mode=train_eval",
		"--use_horovod=True", "--logdir=/runs/lab", "--batch_size_per_gpu", "64"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := Load(a.ConfigFile, a.Overrides)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.ModeCheck(a.Mode); err != nil {
		t.Fatal(err)
	}
	if c.Logdir != "/runs/lab" || c.LogdirPos != "command line --logdir=/runs/lab" {
		t.Errorf("logdir %q at %s", c.Logdir, c.LogdirPos)
	}
	if c.BatchSizePerGPU != 64 || c.Train.BatchSizePerGPU != 64 || c.Eval.BatchSizePerGPU != 16 {
		t.Errorf("batch sizes %d, %d, %d; want 64, 64, 16 (eval_params keeps its own)", c.BatchSizePerGPU, c.Train.BatchSizePerGPU, c.Eval.BatchSizePerGPU)
	}
	if p := c.Positions["batch_size_per_gpu"]; p != "command line --batch_size_per_gpu=64" {
		t.Errorf("batch_size_per_gpu at %s", p)
	}
}
