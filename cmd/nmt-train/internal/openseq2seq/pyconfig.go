package openseq2seq

import (
	"math"
	"strconv"
	"strings"
)

// Pos is where a value came from: "transformer-base.py:31" or
// "command line --batch_size_per_gpu=64".
type Pos string

func at(file string, line int) Pos { return Pos(file + ":" + strconv.Itoa(line)) }

// Error is one problem with a config, its command line or its Python: the
// message starts with the position.
type Error struct {
	Pos Pos
	Msg string
}

func (e *Error) Error() string {
	if e.Pos == "" {
		return e.Msg
	}
	return string(e.Pos) + ": " + e.Msg
}

// subsetHint ends every "cannot read" error.
const subsetHint = "(gorun reads module-level assignments of literals, names and arithmetic; see docs/openseq2seq.md)"

// Kind is the type of a Value.
type Kind int

// The kinds of values a config holds.
const (
	None Kind = iota
	Bool
	Int
	Float
	Str
	List
	Tuple
	Dict
	// Symbol is an imported name or an attribute chain of one
	// (tf.float32, transformer_policy): Value.Str is its full dotted name,
	// resolved through the imports ("tensorflow.float32",
	// "open_seq2seq.optimizers.lr_policies.transformer_policy").
	Symbol
)

var kindNames = [...]string{None: "None", Bool: "bool", Int: "int", Float: "float", Str: "str",
	List: "list", Tuple: "tuple", Dict: "dict", Symbol: "symbol"}

func (k Kind) String() string {
	if k >= 0 && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// a returns the kind with its article: "an int", "a str", "None".
func (k Kind) a() string {
	switch k {
	case None:
		return "None"
	case Int:
		return "an int"
	}
	return "a " + k.String()
}

// Value is one Python value of a config.
type Value struct {
	Kind  Kind
	Pos   Pos // where the expression that made it starts
	Bool  bool
	Int   int64
	Float float64
	Str   string   // a str, or a Symbol's dotted name
	Items []*Value // List and Tuple
	Dict  []*Item  // Dict, in insertion order (a repeated key keeps its place and takes the last value, as Python)
}

// Item is one entry of a dict.
type Item struct {
	Key    string
	KeyPos Pos
	Value  *Value
	// origin names the *_params dict a merged entry came from ("" for
	// base_params); set by merging (config.go).
	origin string
}

// Get returns the entry key of a dict, or nil.
func (v *Value) Get(key string) *Item {
	if v == nil || v.Kind != Dict {
		return nil
	}
	for _, it := range v.Dict {
		if it.Key == key {
			return it
		}
	}
	return nil
}

// Number reports v as a float64 when it is an int or a float.
func (v *Value) Number() (float64, bool) {
	switch v.Kind {
	case Int:
		return float64(v.Int), true
	case Float:
		return v.Float, true
	}
	return 0, false
}

// String writes v as Python's repr would (symbols as their dotted name).
func (v *Value) String() string {
	var b strings.Builder
	v.write(&b)
	return b.String()
}

// reprMax bounds String's output (it is for messages).
const reprMax = 200

func (v *Value) write(b *strings.Builder) {
	switch v.Kind {
	case None:
		b.WriteString("None")
	case Bool:
		if v.Bool {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case Int:
		b.WriteString(strconv.FormatInt(v.Int, 10))
	case Float:
		b.WriteString(formatFloat(v.Float))
	case Str:
		if len(v.Str) > reprMax {
			b.WriteString(pyQuote(v.Str[:reprMax]) + "...")
			break
		}
		b.WriteString(pyQuote(v.Str))
	case Symbol:
		b.WriteString(v.Str)
	case List, Tuple:
		open, close := "[", "]"
		if v.Kind == Tuple {
			open, close = "(", ")"
		}
		b.WriteString(open)
		for i, it := range v.Items {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > reprMax {
				b.WriteString("...")
				break
			}
			it.write(b)
		}
		if v.Kind == Tuple && len(v.Items) == 1 {
			b.WriteString(",")
		}
		b.WriteString(close)
	case Dict:
		b.WriteString("{")
		for i, it := range v.Dict {
			if i > 0 {
				b.WriteString(", ")
			}
			if b.Len() > reprMax {
				b.WriteString("...")
				break
			}
			b.WriteString(pyQuote(it.Key))
			b.WriteString(": ")
			it.Value.write(b)
		}
		b.WriteString("}")
	}
}

func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	case math.IsNaN(f):
		return "nan"
	}
	// Python's repr: the shortest digits, fixed notation for exponents
	// from -4 to 15, else 1e+16 style.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s
}

// pyQuote quotes as Python's repr: single quotes unless the string has a
// single quote and no double quote.
func pyQuote(s string) string {
	q := strconv.Quote(s)
	if strings.Contains(s, "'") && !strings.Contains(s, `"`) {
		return q
	}
	body := strings.ReplaceAll(q[1:len(q)-1], `\"`, `"`)
	return "'" + strings.ReplaceAll(body, "'", `\'`) + "'"
}

// Module is a parsed config file: the names it binds at the end.
type Module struct {
	File  string
	Names map[string]*Value
	order []string
}

// Get returns the value bound to name, or nil.
func (m *Module) Get(name string) *Value { return m.Names[name] }

// NameList returns the bound names in the order they were first bound.
func (m *Module) NameList() []string { return append([]string(nil), m.order...) }

// Limits that keep a hostile file from using unbounded time or memory.
const (
	maxDepth    = 100     // nested brackets and operators
	maxNodes    = 1 << 20 // values made in one file
	maxStrBytes = 1 << 24 // bytes of strings made in one file
)
