package openseq2seq

import (
	"os"
	"strings"
	"testing"
)

// TestParseValues: every construct the parser reads, checked against the
// value Python gives (written as Python's repr).
func TestParseValues(t *testing.T) {
	cases := []struct {
		name, src, want string // want: repr of x
	}{
		{"int", "x = 4001", "4001"},
		{"float", "x = 0.1", "0.1"},
		{"float exponent", "x = 1e-09", "1e-09"},
		{"float forms", "x = (1., .5, 1E+3, 2.5e-3)", "(1.0, 0.5, 1000.0, 0.0025)"},
		{"float repr switches to exponents at 1e16", "x = (1e15, 1e16, 0.0001, 0.00001)", "(1000000000000000.0, 1e+16, 0.0001, 1e-05)"},
		{"underscores and bases", "x = (1_000, 0x1F, 0o17, 0b101, 0)", "(1000, 31, 15, 5, 0)"},
		{"negative", "x = -3", "-3"},
		{"unary plus", "x = +4", "4"},
		{"bools and None", "x = [True, False, None]", "[True, False, None]"},
		{"strings", `x = ('a', "b", '''c''', """d""")`, "('a', 'b', 'c', 'd')"},
		{"escapes", `x = "t\tn\n\\ \x41\101\u00e9 \'\""`, `'t\tn\n\\ AAé \'"'`},
		{"quotes in repr", `x = ["it's", 'say "x"', 'both \'"']`, `["it's", 'say "x"', 'both \'"']`},
		{"unknown escape kept", `x = "\d"`, `'\\d'`},
		{"raw string", `x = r"\n\d"`, `'\\n\\d'`},
		{"u prefix", `x = u"uni"`, "'uni'"},
		{"adjacent literals", `x = "a" 'b' """c"""`, "'abc'"},
		{"adjacent across lines", "x = (\"a\"\n     \"b\")", "'ab'"},
		{"triple-quoted newlines", "x = '''a\nb'''", `'a\nb'`},
		{"backslash-newline in a string", "x = 'ab\\\ncd'", "'abcd'"},
		{"dict", `x = {"a": 1, 'b': [1, 2], "c": {"d": None},}`, "{'a': 1, 'b': [1, 2], 'c': {'d': None}}"},
		{"dict repeated key keeps its place, last value", `x = {"a": 1, "b": 2, "a": 3}`, "{'a': 3, 'b': 2}"},
		{"dict key from a name", "k = 'key'\nx = {k: 1, k + '2': 2}", "{'key': 1, 'key2': 2}"},
		{"empty containers", "x = ([], (), {})", "([], (), {})"},
		{"one-tuple", "x = (1,)", "(1,)"},
		{"bare tuple", "x = 1, 2", "(1, 2)"},
		{"trailing commas", "x = [1, 2,]", "[1, 2]"},
		{"name copies", "a = 512\nx = [a, 4 * a]", "[512, 2048]"},
		{"reassignment", "a = 1\na = a + 1\nx = a", "2"},
		{"chained assignment", "x = y = 7", "7"},
		{"semicolons", "a = 1; x = a + 1;", "2"},
		{"precedence", "x = 1 + 2 * 3 - 8 / 4", "5.0"},
		{"power binds tighter than unary minus", "x = -2 ** 2", "-4"},
		{"power is right-associative", "x = 2 ** 3 ** 2", "512"},
		{"negative power", "x = 2 ** -1", "0.5"},
		{"true division", "x = (7 / 2, 6 / 3)", "(3.5, 2.0)"},
		{"floor division and modulo follow the divisor", "x = (7 // 2, -7 // 2, 7 // -2, -7 % 3, 7 % -3)", "(3, -4, -4, 2, -2)"},
		{"float floor division", "x = (7.5 // 2, 0.5 // 0.1, -7.5 % 2)", "(3.0, 4.0, 0.5)"},
		{"int and float", "x = 3.0 * 2 + 1", "7.0"},
		{"large ints", "x = 2 ** 62 + (2 ** 62 - 1)", "9223372036854775807"},
		{"parentheses", "x = (((1 + 2)) * 3)", "9"},
		{"string +", "root = '/data/'\nx = root + 'train.en'", "'/data/train.en'"},
		{"list +", "x = [1] + [2, 3]", "[1, 2, 3]"},
		{"tuple +", "x = (1,) + (2,)", "(1, 2)"},
		{"implicit joining", "x = [\n  1,\n  # a comment\n\n  2,\n]", "[1, 2]"},
		{"backslash continuation", "x = 1 + \\\n    2", "3"},
		{"comments and blank lines", "# c\n\nx = 1  # trailing\n\n", "1"},
		{"docstring", "\"\"\"A docstring.\n\"\"\"\nx = 1\n'another'", "1"},
		{"CRLF", "x = [1,\r\n 2]\r\n", "[1, 2]"},
		{"BOM", "\ufeffx = 1", "1"},
		{"tf without an import (run.py binds it)", "x = tf.float32", "tensorflow.float32"},
		{"import as", "import tensorflow as tf\nx = tf.contrib.opt.LazyAdamOptimizer", "tensorflow.contrib.opt.LazyAdamOptimizer"},
		{"from import", "from open_seq2seq.data.text2text.tokenizer import EOS_ID\nx = EOS_ID", "open_seq2seq.data.text2text.tokenizer.EOS_ID"},
		{"from import as", "from a.b import X, Y as Z\nx = (X, Z)", "(a.b.X, a.b.Y)"},
		{"from import in parentheses", "from a import (\n  X,\n  Y,\n)\nx = Y", "a.Y"},
		{"attribute chain", "from open_seq2seq.data.text2text.text2text import SpecialTextTokens\nx = SpecialTextTokens.S_ID.value",
			"open_seq2seq.data.text2text.text2text.SpecialTextTokens.S_ID.value"},
		{"import a.b binds a", "import os.path\nx = os.path.sep", "os.path.sep"},
		{"__future__ binds nothing", "from __future__ import absolute_import, division\nx = 1", "1"},
		{"unicode names", "größe = 3\nx = größe", "3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Parse("f.py", []byte(c.src))
			if err != nil {
				t.Fatal(err)
			}
			x := m.Get("x")
			if x == nil {
				t.Fatalf("x is not bound; names: %v", m.NameList())
			}
			if got := x.String(); got != c.want {
				t.Errorf("got %s, want %s", got, c.want)
			}
		})
	}
}

func TestParseBindings(t *testing.T) {
	m, err := Parse("f.py", []byte("from __future__ import division\nimport tensorflow as tf\nb = 1\na = 2\nb = 3\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(m.NameList(), " "); got != "tf b a" {
		t.Errorf("names %q, want \"tf b a\"", got)
	}
	if m.Get("division") != nil {
		t.Error("from __future__ bound a name")
	}
	m, _ = Parse("f.py", []byte("x = tf.float32\n"))
	if m.Get("tf") != nil {
		t.Error("the predefined tf is listed as bound by the file")
	}
}

// TestParseErrors: everything outside the subset is one error naming the
// line.
func TestParseErrors(t *testing.T) {
	hint := "(gorun reads module-level assignments of literals, names and arithmetic; see docs/openseq2seq.md)"
	cases := []struct {
		name, src, want string // want: the whole message, or its start when it ends in "..."
	}{
		{"function call", "a = 1\nx = int(4.5)", "f.py:2: cannot read a call of int(...) " + hint},
		{"call of an imported name", "import os\nx = os.path.join('a', 'b')", "f.py:2: cannot read a call of os.path.join(...) " + hint},
		{"call of an undefined name", "x = os.path.join('a')", "f.py:1: cannot read the name os: it is not assigned or imported before this line " + hint},
		{"print", "print('hi')", "f.py:1: cannot read a call of print(...) " + hint},
		{"undefined name", "x = 1\ny = d_model", "f.py:2: cannot read the name d_model: it is not assigned or imported before this line " + hint},
		{"name used before it is assigned", "y = x\nx = 1", "f.py:1: cannot read the name x: it is not assigned or imported before this line " + hint},
		{"list comprehension", "x = [i for i in y]", "f.py:1: cannot read the name i..."},
		{"comprehension over a known name", "y = [1]\nx = [\n  2 * 3\n  for i in y]", "f.py:4: cannot read a comprehension " + hint},
		{"if statement", "x = 1\nif x:\n  y = 2", "f.py:2: cannot read a 'if' statement " + hint},
		{"for", "for i in []:\n  pass", "f.py:1: cannot read a 'for' statement " + hint},
		{"def", "\n\ndef f():\n  return 1", "f.py:3: cannot read a 'def' statement " + hint},
		{"class", "class A:\n  pass", "f.py:1: cannot read a 'class' statement " + hint},
		{"lambda", "x = {'f': lambda s: s}", "f.py:1: cannot read a lambda " + hint},
		{"conditional expression", "x = 1 if True else 2", "f.py:1: cannot read a conditional expression (x if c else y) " + hint},
		{"comparison", "x = 1 < 2", "f.py:1: cannot read a comparison " + hint},
		{"boolean operator", "x = True and False", "f.py:1: cannot read the operator 'and' " + hint},
		{"not", "x = not True", "f.py:1: cannot read the operator 'not' " + hint},
		{"bitwise", "x = 1 | 2", "f.py:1: cannot read the operator | " + hint},
		{"invert", "x = ~1", "f.py:1: cannot read the operator ~ " + hint},
		{"subscript", "a = [1]\nx = a[0]", "f.py:2: cannot read a subscript ([...]) " + hint},
		{"subscript assignment", "d = {}\nd['a'] = 1", "f.py:2: cannot read an assignment to anything but a plain name " + hint},
		{"attribute assignment", "import a\na.b = 1", "f.py:2: cannot read an assignment to anything but a plain name " + hint},
		{"augmented assignment", "x = 1\nx += 1", "f.py:2: cannot read an augmented assignment (+=) " + hint},
		{"tuple unpacking", "a, b = 1, 2", "f.py:1: cannot read an assignment to anything but a plain name " + hint},
		{"annotated assignment", "x: int = 1", "f.py:1: cannot read an annotated assignment " + hint},
		{"bare expression", "x = 1\nx", "f.py:2: cannot read an expression statement (only docstrings stand alone) " + hint},
		{"indented line", "x = 1\n  y = 2", "f.py:2: cannot read an indented line (only module-level statements are read) " + hint},
		{"attribute of a value", "x = 'a'.upper", "f.py:1: cannot read the attribute .upper of a str (only attributes of imported names) " + hint},
		{"star import", "from a import *", "f.py:1: cannot read 'from a import *' (the names it binds are unknown) " + hint},
		{"relative import", "from . import a", "f.py:1: cannot read a relative import " + hint},
		{"set literal", "x = {'a', 'b'}", "f.py:1: cannot read a set literal " + hint},
		{"dict unpacking", "a = {}\nx = {**a}", "f.py:2: cannot read dict unpacking (**) " + hint},
		{"list unpacking", "a = []\nx = [*a]", "f.py:2: cannot read unpacking (*) " + hint},
		{"non-string key", "x = {\n  1: 'a'}", "f.py:2: cannot read a dict key that is an int (1); keys must be strings " + hint},
		{"string + int", "x = 'a' + 1", "f.py:1: cannot read str + int ('a' + 1) " + hint},
		{"bool arithmetic", "x = True + 1", "f.py:1: cannot read bool + int (True + 1) " + hint},
		{"symbol arithmetic", "x = tf.float32 * 2", "f.py:1: cannot read symbol * int (tensorflow.float32 * 2) " + hint},
		{"list repetition", "x = [1] * 3", "f.py:1: cannot read list * int ([1] * 3) " + hint},
		{"unary minus on a string", "x = -'a'", "f.py:1: cannot read unary - on a str ('a') " + hint},
		{"division by zero", "x = 1 / 0", "f.py:1: cannot read a division by zero " + hint},
		{"modulo by zero", "x = 1.5 % 0", "f.py:1: cannot read a division by zero " + hint},
		{"integer overflow", "x = 2 ** 63", "f.py:1: cannot read an integer larger than 64 bits " + hint},
		{"integer literal overflow", "x = 9223372036854775808", "f.py:1: cannot read the integer 9223372036854775808 (larger than 64 bits) " + hint},
		{"float overflow in **", "x = 10.0 ** 400", "f.py:1: cannot read a float overflow in ** " + hint},
		{"complex number", "x = 1j", "f.py:1: cannot read a complex number " + hint},
		{"complex result", "x = (-8) ** 0.5", "f.py:1: cannot read a complex result (negative ** fraction) " + hint},
		{"f-string", "x = f'{1}'", "f.py:1: cannot read an f-string " + hint},
		{"bytes", "x = b'a'", "f.py:1: cannot read a bytes literal " + hint},
		{"ellipsis", "x = ...", "f.py:1: cannot read Ellipsis (...) " + hint},
		{"keyword argument", "x = (a=1)", "f.py:1: cannot read the name a: it is not assigned or imported before this line " + hint},
		{"deep nesting", "x = " + strings.Repeat("[", 150) + strings.Repeat("]", 150), "f.py:1: cannot read an expression nested more than 100 deep " + hint},
		{"unterminated string", "x = 1\ny = 'abc\n", "f.py:2: syntax error: string literal is never closed on its line"},
		{"unterminated triple string", "x = '''abc\n\n", "f.py:1: syntax error: string literal is never closed"},
		{"unclosed bracket", "x = {\n  'a': 1,\n\ny = 2", "f.py:1: syntax error: bracket opened here is never closed"},
		{"wrong closing bracket", "x = {\n  'a': 1\n]", "f.py:3: syntax error: expected ',' or '}' (to close the '{' of line 1), found ']'"},
		{"errors come in line order", "x = int(1)\ny = 'abc", "f.py:1: cannot read a call of int(...) " + hint},
		{"bracket never closed", "x = [1,\n 2", "f.py:1: syntax error: bracket opened here is never closed"},
		{"unmatched bracket", "x = 1)", "f.py:1: syntax error: unmatched ')'"},
		{"missing comma", "x = {\n  'a': 1\n  'b': 2}", "f.py:3: syntax error: expected ',' or '}' (to close the '{' of line 1), found a string"},
		{"leading zeros", "x = 007", "f.py:1: syntax error: leading zeros in the integer \"007\" (Python 3 writes octal as 0o)"},
		{"bad number", "x = 1_", "f.py:1: syntax error: invalid number \"1_\""},
		{"bad hex", "x = 0xg", "f.py:1: syntax error: invalid number \"0x\""},
		{"bad escape", `x = "\x4"`, `f.py:1: syntax error: truncated \x escape`},
		{"named escape", `x = "\N{DASH}"`, `f.py:1: cannot read a \N{...} escape ` + hint},
		{"stray character", "x = 1 $ 2", "f.py:1: syntax error: unexpected character '$'"},
		{"backslash not at the end", "x = 1 \\ 2", "f.py:1: syntax error: a backslash continues a line only at its end"},
		{"invalid UTF-8", "x = 1\ny = '\xff'", "f.py:2: syntax error: the file is not valid UTF-8"},
		{"assignment to a keyword", "None = 1", "f.py:1: cannot read an assignment to anything but a plain name " + hint},
		{"missing value", "x = ", "f.py:1: syntax error: expected a value, found the end of the line"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("f.py", []byte(c.src))
			if err == nil {
				t.Fatal("no error")
			}
			got := err.Error()
			if strings.Contains(got, "\n") {
				t.Errorf("error spans lines: %q", got)
			}
			if w, ok := strings.CutSuffix(c.want, "..."); ok {
				if !strings.HasPrefix(got, w) {
					t.Errorf("got  %s\nwant %s...", got, w)
				}
			} else if got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

// TestParsePositions: every value and every dict key remembers its line.
func TestParsePositions(t *testing.T) {
	src := `norm = {
  "type": "layernorm_L2",
}
base = {
  "a": 1,
  "nested": {
    "b": norm,
  },
  "c": 2 +
       3,
}
`
	m, err := Parse("cfg.py", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	base := m.Get("base")
	if base.Pos != "cfg.py:4" {
		t.Errorf("base at %s", base.Pos)
	}
	for _, c := range []struct {
		path string
		key  Pos
		val  Pos
	}{
		{"a", "cfg.py:5", "cfg.py:5"},
		{"nested", "cfg.py:6", "cfg.py:6"},
		{"nested/b", "cfg.py:7", "cfg.py:7"},      // the copy of norm starts where norm is named
		{"nested/b/type", "cfg.py:2", "cfg.py:2"}, // what it holds keeps the lines of norm's definition
		{"c", "cfg.py:9", "cfg.py:9"},             // an expression is where it starts
	} {
		it := get(base, c.path)
		if it == nil {
			t.Fatalf("%s missing", c.path)
		}
		if it.KeyPos != c.key || it.Value.Pos != c.val {
			t.Errorf("%s: key at %s, value at %s; want %s, %s", c.path, it.KeyPos, it.Value.Pos, c.key, c.val)
		}
	}
	if m.Get("norm").Get("type").Value == get(base, "nested/b/type").Value {
		t.Error("a name's value is shared, not copied")
	}
}

// TestParseLabConfig reads the lab's config as a whole.
func TestParseLabConfig(t *testing.T) {
	src, err := os.ReadFile("testdata/lab-transformer-base.py")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse("lab.py", src)
	if err != nil {
		t.Fatal(err)
	}
	base := m.Get("base_params")
	for path, want := range map[string]string{
		"encoder_params/filter_size": "2048",
		"optimizer":                  "tensorflow.contrib.opt.LazyAdamOptimizer",
		"optimizer_params/epsilon":   "1e-09",
		"lr_policy":                  "open_seq2seq.optimizers.lr_policies.transformer_policy",
		"decoder_params/GO_SYMBOL":   "open_seq2seq.data.text2text.text2text.SpecialTextTokens.S_ID.value",
		"decoder_params/EOS_ID":      "open_seq2seq.data.text2text.tokenizer.EOS_ID",
		"dtype":                      "tensorflow.float32",
	} {
		if got := get(base, path).Value.String(); got != want {
			t.Errorf("%s = %s, want %s", path, got, want)
		}
	}
	if got := get(m.Get("train_params"), "data_layer_params/source_file").Value.Str; got != "/data/wmt16_de_en/train.clean.en.shuffled.BPE_common.32K.tok" {
		t.Errorf("source_file %q", got)
	}
}
