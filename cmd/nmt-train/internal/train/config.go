// Package train is nmt-train's training loop: the wiring between data,
// transformer, collective and rank. It holds no model math.
package train

import (
	"bytes"
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
// accepted for dashes). An unknown key, or a key given twice (max-steps
// and max_steps are one key), is an error naming the file and the line.
func ApplyConfigFile(c *cli.Context, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	known := map[string]cli.Flag{}
	for _, f := range c.Command.Flags {
		for _, n := range f.Names() {
			known[n] = f
		}
	}
	var items []configItem
	if strings.ToLower(filepath.Ext(path)) == ".json" {
		items, err = jsonItems(path, raw)
	} else {
		items, err = yamlItems(path, raw)
	}
	if err != nil {
		return err
	}
	sort.SliceStable(items, func(a, b int) bool { return items[a].line < items[b].line })
	first := map[string]configItem{} // by flag name
	for _, it := range items {
		name := strings.ReplaceAll(it.key, "_", "-")
		f, ok := known[name]
		if !ok || name == "config" || name == "help" {
			return fmt.Errorf("%s:%d: unknown key %q (run nmt-train train --help for the options)", path, it.line, it.key)
		}
		if was, ok := first[f.Names()[0]]; ok {
			as := ""
			if was.key != it.key {
				as = fmt.Sprintf(" as %q", was.key)
			}
			return fmt.Errorf("%s:%d: key %q is given twice (first at line %d%s)", path, it.line, it.key, was.line, as)
		}
		first[f.Names()[0]] = it
	}
	for _, it := range items {
		name := strings.ReplaceAll(it.key, "_", "-")
		if c.IsSet(name) {
			continue // the command line wins
		}
		if err := c.Set(name, it.val); err != nil {
			return fmt.Errorf("%s:%d: %s: %w", path, it.line, it.key, err)
		}
	}
	return nil
}

// configItem is one key of a config file: its value as a flag's text and
// the line it is on.
type configItem struct {
	key, val string
	line     int
}

// yamlItems reads a YAML mapping of option: value (yaml.v3 keeps a key
// given twice in a node tree; ApplyConfigFile refuses it).
func yamlItems(path string, raw []byte) ([]configItem, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("%s: not valid YAML: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	m := doc.Content[0]
	if m.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of option: value", path, m.Line)
	}
	var items []configItem
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		if v.Kind != yaml.ScalarNode {
			return nil, fmt.Errorf("%s:%d: %s: want a single value", path, v.Line, k.Value)
		}
		items = append(items, configItem{k.Value, v.Value, k.Line})
	}
	return items, nil
}

// jsonItems reads a JSON object of "option": value token by token, every
// key with its line (encoding/json's maps keep the last of a key given
// twice, silently).
func jsonItems(path string, raw []byte) ([]configItem, error) {
	bad := func(err error) error { return fmt.Errorf("%s: not valid JSON: %w", path, err) }
	lineAt := func(off int64) int { return bytes.Count(raw[:min(off, int64(len(raw)))], []byte("\n")) + 1 }
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	t, err := dec.Token()
	if err != nil {
		return nil, bad(err)
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("%s:%d: want an object of \"option\": value", path, lineAt(dec.InputOffset()))
	}
	var items []configItem
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, bad(err)
		}
		key, _ := t.(string) // an object's keys are strings
		line := lineAt(dec.InputOffset())
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, bad(err)
		}
		items = append(items, configItem{key, scalarString(v), line})
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, bad(err)
	}
	return items, nil
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
