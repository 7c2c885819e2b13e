package openseq2seq

import (
	"os"
	"strings"
	"testing"
)

// FuzzParse feeds arbitrary text to the parser and to Load: they return a
// value or one error naming a line, and never panic.
func FuzzParse(f *testing.F) {
	for _, p := range []string{"testdata/lab-transformer-base.py", "testdata/transformer-big-mixed.py"} {
		src, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(src)
	}
	for _, s := range []string{
		"x = 1 + 2 * 3 ** -1 // 4 % 5\n",
		"from a.b import (X, Y as Z)\nimport c.d as e\nx = e.f.g\n",
		"x = {'a': [1, (2,), {}], \"b\": '''c\nd''' 'e' r'\\n'}\n",
		"x = \\\n  -0x_1f + 1_0.5e-3 + .5 + 1.\n",
		"'''doc'''; y = x = 2\n",
		"base_params = {\"batch_size_per_gpu\": 1}\nbase_model = Text2Text\n",
		"x = [\n",
		"x = 'a\\\nb' + \"\\x41\\u00e9\\101\"\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		m, err := Parse("f.py", src)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "f.py:") || strings.Contains(msg, "\n") {
				t.Fatalf("error without a position or on several lines: %q", msg)
			}
			return
		}
		for _, n := range m.NameList() {
			_ = m.Get(n).String()
		}
		c, err := LoadSource("f.py", src, nil)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "f.py") || strings.Contains(msg, "\n") {
				t.Fatalf("Load error without the file or on several lines: %q", msg)
			}
			return
		}
		for _, mode := range []string{"train", "eval", "train_eval", "infer"} {
			_ = c.ModeCheck(mode)
		}
	})
}

// FuzzArgs feeds arbitrary command lines (NUL-separated) to ParseArgs and
// the overrides it returns to Load of the lab's config.
func FuzzArgs(f *testing.F) {
	lab, err := os.ReadFile("testdata/lab-transformer-base.py")
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"--config_file=c.py\x00--mode=train_eval\x00--use_horovod=True\x00--logdir=D",
		"--config_file\x00c.py\x00--batch_size_per_gpu\x0064\x00--lr_policy_params/learning_rate=-1.5",
		"--conf=c.py\x00--bench\x00--print=1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseArgs(strings.Split(s, "\x00"))
		if err != nil {
			return
		}
		if _, err := LoadSource("lab.py", lab, a.Overrides); err != nil && strings.Contains(err.Error(), "\n") {
			t.Fatalf("error on several lines: %q", err)
		}
	})
}
