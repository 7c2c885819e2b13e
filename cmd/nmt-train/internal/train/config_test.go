package train

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

func runWithConfig(t *testing.T, name, content string, args ...string) (map[string]any, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	os.WriteFile(path, []byte(content), 0o644)
	got := map[string]any{}
	app := &cli.App{
		Name: "x",
		Commands: []*cli.Command{{
			Name: "train",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "config"},
				&cli.Float64Flag{Name: "learning-rate", Value: 2.0},
				&cli.IntFlag{Name: "warmup-steps", Value: 8000},
				&cli.StringFlag{Name: "preset", Value: "base"},
				&cli.BoolFlag{Name: "resume"},
			},
			Action: func(c *cli.Context) error {
				if err := ApplyConfigFile(c, c.String("config")); err != nil {
					return err
				}
				got["lr"], got["warmup"], got["preset"], got["resume"] = c.Float64("learning-rate"), c.Int("warmup-steps"), c.String("preset"), c.Bool("resume")
				return nil
			},
		}},
	}
	err := app.Run(append([]string{"x", "train", "--config", path}, args...))
	return got, err
}

func TestConfigFile(t *testing.T) {
	got, err := runWithConfig(t, "c.yaml", "# lab settings\nlearning_rate: 1.5\nwarmup-steps: 4000\nresume: true\n", "--preset", "tiny")
	if err != nil {
		t.Fatal(err)
	}
	if got["lr"] != 1.5 || got["warmup"] != 4000 || got["preset"] != "tiny" || got["resume"] != true {
		t.Errorf("got %v", got)
	}
	// The command line wins over the file.
	got, err = runWithConfig(t, "c.json", `{"learning-rate": 1.5, "preset": "small"}`, "--learning-rate", "3")
	if err != nil || got["lr"] != 3.0 || got["preset"] != "small" {
		t.Errorf("got %v %v", got, err)
	}
}

func TestConfigUnknownKey(t *testing.T) {
	_, err := runWithConfig(t, "c.yaml", "learning_rate: 1\n\nwarmpu_steps: 10\n")
	if err == nil || !strings.Contains(err.Error(), "c.yaml:3: unknown key \"warmpu_steps\"") {
		t.Fatalf("got %v", err)
	}
	_, err = runWithConfig(t, "c.json", "{\n \"lr\": 1}")
	if err == nil || !strings.Contains(err.Error(), "c.json:2: unknown key \"lr\"") {
		t.Fatalf("got %v", err)
	}
	_, err = runWithConfig(t, "c.yaml", "warmup_steps: many\n")
	if err == nil || !strings.Contains(err.Error(), "c.yaml:1: warmup_steps") {
		t.Fatalf("got %v", err)
	}
}

// A key given twice is refused naming both lines, in YAML (yaml.v3's node
// tree keeps both) and in JSON (encoding/json keeps the last, silently);
// a dash and an underscore name one key. Nothing is applied.
func TestConfigDuplicateKey(t *testing.T) {
	for _, c := range []struct {
		name, content, want string
	}{
		{"x.yaml", "# lab\nlearning-rate: 1\nwarmup-steps: 10\npreset: tiny\n\n\nwarmup-steps: 20\n", `x.yaml:7: key "warmup-steps" is given twice (first at line 3)`},
		{"x.yaml", "warmup_steps: 10\nwarmup-steps: 20\n", `x.yaml:2: key "warmup-steps" is given twice (first at line 1 as "warmup_steps")`},
		{"x.json", "{\n  \"warmup-steps\": 10,\n  \"preset\": \"tiny\",\n  \"warmup-steps\": 20\n}\n", `x.json:4: key "warmup-steps" is given twice (first at line 2)`},
		{"x.json", `{"preset": "tiny", "preset": "small"}`, `x.json:1: key "preset" is given twice (first at line 1)`},
	} {
		got, err := runWithConfig(t, c.name, c.content)
		if err == nil || !strings.HasSuffix(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s %q: got %v, want an error ending %q", c.name, c.content, err, c.want)
		}
		if len(got) != 0 {
			t.Errorf("%s: applied %v", c.name, got)
		}
	}
	// JSON: the line of each key, an object wanted
	if _, err := runWithConfig(t, "c.json", "{\n \"learning-rate\": 1,\n\n \"lr\": 2}"); err == nil || !strings.Contains(err.Error(), `c.json:4: unknown key "lr"`) {
		t.Errorf("unknown key on line 4: %v", err)
	}
	if _, err := runWithConfig(t, "c.json", `["preset"]`); err == nil || !strings.Contains(err.Error(), "c.json:1: want an object") {
		t.Errorf("an array: %v", err)
	}
	if _, err := runWithConfig(t, "c.json", `{"preset": "tiny",}`); err == nil || !strings.Contains(err.Error(), "c.json: not valid JSON") {
		t.Errorf("a trailing comma: %v", err)
	}
}
