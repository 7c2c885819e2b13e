// Package train is nmt-train's training loop: the wiring between data,
// transformer, collective and rank. It holds no model math.
package train

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	"gopkg.in/yaml.v3"
)

// ApplyConfigFile sets every flag named in a YAML or JSON config file that
// was not given on the command line (the command line wins). Keys are the
// flags' long names (learning-rate, warmup-steps, ...; underscores are
// accepted for dashes). An unknown key is an error naming the file and line.
func ApplyConfigFile(c *cli.Context, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %v", err)
	}
	known := map[string]cli.Flag{}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			known[n] = f
		}
	}
	type kv struct {
		key, val string
		line     int
	}
	var items []kv
	switch strings.ToLower(filepath.Ext(path)) {
	case ".json":
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(string(raw)))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return fmt.Errorf("%s: not valid JSON: %v", path, err)
		}
		for k, v := range m {
			items = append(items, kv{k, scalarString(v), lineOf(string(raw), `"`+k+`"`)})
		}
	default:
		var doc yaml.Node
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			return fmt.Errorf("%s: not valid YAML: %v", path, err)
		}
		if len(doc.Content) == 0 {
			return nil
		}
		m := doc.Content[0]
		if m.Kind != yaml.MappingNode {
			return fmt.Errorf("%s:%d: want a mapping of option: value", path, m.Line)
		}
		for i := 0; i+1 < len(m.Content); i += 2 {
			k, v := m.Content[i], m.Content[i+1]
			if v.Kind != yaml.ScalarNode {
				return fmt.Errorf("%s:%d: %s: want a single value", path, v.Line, k.Value)
			}
			items = append(items, kv{k.Value, v.Value, k.Line})
		}
	}
	sort.Slice(items, func(a, b int) bool { return items[a].line < items[b].line })
	for _, it := range items {
		name := strings.ReplaceAll(it.key, "_", "-")
		if _, ok := known[name]; !ok || name == "config" || name == "help" {
			return fmt.Errorf("%s:%d: unknown key %q (run nmt-train train --help for the options)", path, it.line, it.key)
		}
		if c.IsSet(name) {
			continue // the command line wins
		}
		if err := c.Set(name, it.val); err != nil {
			return fmt.Errorf("%s:%d: %s: %v", path, it.line, it.key, err)
		}
	}
	return nil
}

func scalarString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return fmt.Sprint(x)
	case nil:
		return ""
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

func lineOf(text, needle string) int {
	i := strings.Index(text, needle)
	if i < 0 {
		return 0
	}
	return strings.Count(text[:i], "\n") + 1
}
