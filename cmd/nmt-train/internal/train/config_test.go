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
