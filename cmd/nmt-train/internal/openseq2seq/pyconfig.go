// Package openseq2seq reads OpenSeq2Seq's Python config files and run.py's
// command line without a Python interpreter (docs/openseq2seq.md).
//
// pyconfig.go reads the subset of Python the configs are written in:
// module-level imports and assignments of literals, names and arithmetic.
// config.go turns a text2text Transformer config into a Config; args.go
// parses run.py's command line.
package openseq2seq

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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

// ---------------------------------------------------------------------------
// Tokenizer

type tokKind int

const (
	tEOF tokKind = iota
	tNewline
	tName
	tNumber
	tString
	tOp
	// tError stands where the tokenizer found an error, so that the
	// statements before it are read (and their errors come first).
	tError
)

type token struct {
	kind tokKind
	text string // name, operator, the number's text
	line int
	// numbers and strings, decoded
	isFloat bool
	ival    int64
	fval    float64
	sval    string
	err     error // tError
}

type lexer struct {
	file  string
	src   string
	i     int
	line  int
	toks  []token
	stack []int // lines of the open brackets
}

func (lx *lexer) errf(line int, format string, a ...any) error {
	return &Error{Pos: at(lx.file, line), Msg: fmt.Sprintf(format, a...)}
}

func (lx *lexer) cannot(line int, what string) error {
	return &Error{Pos: at(lx.file, line), Msg: "cannot read " + what + " " + subsetHint}
}

func tokenize(file string, src []byte) ([]token, error) {
	s := string(src)
	s = strings.TrimPrefix(s, "\ufeff")
	if !utf8.ValidString(s) {
		line := 1
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				break
			}
			if r == '\n' {
				line++
			}
			i += n
		}
		return nil, &Error{Pos: at(file, line), Msg: "syntax error: the file is not valid UTF-8"}
	}
	lx := &lexer{file: file, src: s, line: 1}
	if err := lx.run(); err != nil {
		if len(lx.stack) > 0 && lx.i >= len(s) {
			return nil, err // a bracket never closed: the rest cannot be read
		}
		lx.emit(token{kind: tError, line: lx.line, err: err})
	}
	return lx.toks, nil
}

func (lx *lexer) emit(t token) { lx.toks = append(lx.toks, t) }

func (lx *lexer) newline() {
	if n := len(lx.toks); n > 0 && lx.toks[n-1].kind != tNewline {
		lx.emit(token{kind: tNewline, line: lx.line})
	}
}

func (lx *lexer) run() error {
	s := lx.src
	lineStart := true
	for lx.i < len(s) {
		if lineStart && len(lx.stack) == 0 {
			lineStart = false
			j := lx.i
			for j < len(s) && (s[j] == ' ' || s[j] == '\t' || s[j] == '\f') {
				j++
			}
			blank := j == len(s) || s[j] == '#' || s[j] == '\n' || s[j] == '\r' || s[j] == '\\'
			if j > lx.i && !blank {
				return lx.cannot(lx.line, "an indented line (only module-level statements are read)")
			}
			lx.i = j
			continue
		}
		c := s[lx.i]
		switch {
		case c == ' ' || c == '\t' || c == '\f':
			lx.i++
		case c == '#':
			for lx.i < len(s) && s[lx.i] != '\n' && s[lx.i] != '\r' {
				lx.i++
			}
		case c == '\n' || c == '\r':
			lx.i++
			if c == '\r' && lx.i < len(s) && s[lx.i] == '\n' {
				lx.i++
			}
			if len(lx.stack) == 0 {
				lx.newline()
				lineStart = true
			}
			lx.line++
		case c == '\\':
			lx.i++
			switch {
			case strings.HasPrefix(s[lx.i:], "\r\n"):
				lx.i += 2
			case lx.i < len(s) && (s[lx.i] == '\n' || s[lx.i] == '\r'):
				lx.i++
			default:
				return lx.errf(lx.line, "syntax error: a backslash continues a line only at its end")
			}
			lx.line++
			if lx.i >= len(s) {
				return lx.errf(lx.line-1, "syntax error: the file ends after a backslash")
			}
		case c >= '0' && c <= '9' || c == '.' && lx.i+1 < len(s) && s[lx.i+1] >= '0' && s[lx.i+1] <= '9':
			if err := lx.number(); err != nil {
				return err
			}
		case c == '"' || c == '\'':
			if err := lx.str(""); err != nil {
				return err
			}
		case c == '_' || c < utf8.RuneSelf && unicode.IsLetter(rune(c)) || c >= utf8.RuneSelf:
			start := lx.i
			for lx.i < len(s) {
				r, n := utf8.DecodeRuneInString(s[lx.i:])
				if r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
					break
				}
				lx.i += n
			}
			if lx.i == start {
				r, _ := utf8.DecodeRuneInString(s[lx.i:])
				return lx.errf(lx.line, "syntax error: unexpected character %q", r)
			}
			name := s[start:lx.i]
			if lx.i < len(s) && (s[lx.i] == '"' || s[lx.i] == '\'') && isStrPrefix(name) {
				if err := lx.str(strings.ToLower(name)); err != nil {
					return err
				}
				continue
			}
			lx.emit(token{kind: tName, text: name, line: lx.line})
		default:
			if err := lx.op(); err != nil {
				return err
			}
		}
	}
	if len(lx.stack) > 0 {
		return lx.errf(lx.stack[len(lx.stack)-1], "syntax error: bracket opened here is never closed")
	}
	lx.newline()
	lx.emit(token{kind: tEOF, line: lx.line})
	return nil
}

func isStrPrefix(p string) bool {
	switch strings.ToLower(p) {
	case "r", "u", "b", "f", "br", "rb", "fr", "rf":
		return true
	}
	return false
}

var ops3 = []string{"**=", "//=", ">>=", "<<=", "..."}
var ops2 = []string{"**", "//", "==", "!=", "<=", ">=", "<<", ">>", "->", ":=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "@="}

func (lx *lexer) op() error {
	s := lx.src[lx.i:]
	for _, group := range [][]string{ops3, ops2} {
		for _, o := range group {
			if strings.HasPrefix(s, o) {
				lx.emit(token{kind: tOp, text: o, line: lx.line})
				lx.i += len(o)
				return nil
			}
		}
	}
	c := s[0]
	switch c {
	case '(', '[', '{':
		lx.stack = append(lx.stack, lx.line)
	case ')', ']', '}':
		if len(lx.stack) == 0 {
			return lx.errf(lx.line, "syntax error: unmatched %q", c)
		}
		lx.stack = lx.stack[:len(lx.stack)-1]
	case '+', '-', '*', '/', '%', '<', '>', '=', '.', ',', ':', ';', '@', '&', '|', '^', '~':
	default:
		r, _ := utf8.DecodeRuneInString(s)
		return lx.errf(lx.line, "syntax error: unexpected character %q", r)
	}
	lx.emit(token{kind: tOp, text: string(c), line: lx.line})
	lx.i++
	return nil
}

func isDigitIn(c byte, base int) bool {
	switch base {
	case 16:
		return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
	case 8:
		return c >= '0' && c <= '7'
	case 2:
		return c == '0' || c == '1'
	}
	return c >= '0' && c <= '9'
}

// underscoresOK checks Python's rule: an underscore sits between two digits
// (or after a base prefix).
func underscoresOK(t string, base int) bool {
	for k := 0; k < len(t); k++ {
		if t[k] != '_' {
			continue
		}
		if k+1 >= len(t) || !isDigitIn(t[k+1], base) {
			return false
		}
		if k == 0 {
			return false
		}
		p := t[k-1]
		if !isDigitIn(p, base) && !(base != 10 && k == 2 && (p|0x20 == 'x' || p|0x20 == 'o' || p|0x20 == 'b')) {
			return false
		}
	}
	return true
}

func (lx *lexer) number() error {
	s := lx.src
	start := lx.i
	line := lx.line
	isFloat := false
	if s[lx.i] == '0' && lx.i+1 < len(s) && strings.IndexByte("xXoObB", s[lx.i+1]) >= 0 {
		base := map[byte]int{'x': 16, 'o': 8, 'b': 2}[s[lx.i+1]|0x20]
		lx.i += 2
		for lx.i < len(s) && (isDigitIn(s[lx.i], 16) || s[lx.i] == '_') {
			lx.i++
		}
		t := s[start:lx.i]
		if lx.i < len(s) && (s[lx.i] == '_' || s[lx.i] == '.' || unicode.IsLetter(rune(s[lx.i]))) || len(t) == 2 || !underscoresOK(t, base) {
			return lx.errf(line, "syntax error: invalid number %q", t)
		}
		for _, c := range []byte(strings.ReplaceAll(t[2:], "_", "")) {
			if !isDigitIn(c, base) {
				return lx.errf(line, "syntax error: invalid number %q", t)
			}
		}
		v, err := strconv.ParseInt(strings.ReplaceAll(t, "_", ""), 0, 64)
		if err != nil {
			return lx.cannot(line, fmt.Sprintf("the integer %s (larger than 64 bits)", t))
		}
		lx.emit(token{kind: tNumber, text: t, line: line, ival: v})
		return nil
	}
	digits := func() {
		for lx.i < len(s) && (s[lx.i] >= '0' && s[lx.i] <= '9' || s[lx.i] == '_') {
			lx.i++
		}
	}
	digits()
	if lx.i < len(s) && s[lx.i] == '.' {
		isFloat = true
		lx.i++
		digits()
	}
	if lx.i < len(s) && (s[lx.i] == 'e' || s[lx.i] == 'E') {
		j := lx.i + 1
		if j < len(s) && (s[j] == '+' || s[j] == '-') {
			j++
		}
		if j < len(s) && s[j] >= '0' && s[j] <= '9' {
			isFloat = true
			lx.i = j
			digits()
		}
	}
	t := s[start:lx.i]
	if lx.i < len(s) && (s[lx.i] == 'j' || s[lx.i] == 'J') {
		return lx.cannot(line, "a complex number")
	}
	if lx.i < len(s) && (s[lx.i] == '_' || s[lx.i] == '.' || s[lx.i] < utf8.RuneSelf && unicode.IsLetter(rune(s[lx.i]))) {
		return lx.errf(line, "syntax error: invalid number %q", s[start:lx.i+1])
	}
	// underscores: only between digits
	for k := 0; k < len(t); k++ {
		if t[k] == '_' && (k == 0 || k+1 >= len(t) || t[k-1] < '0' || t[k-1] > '9' || t[k+1] < '0' || t[k+1] > '9') {
			return lx.errf(line, "syntax error: invalid number %q", t)
		}
	}
	clean := strings.ReplaceAll(t, "_", "")
	if isFloat {
		f, err := strconv.ParseFloat(clean, 64)
		if err != nil && !math.IsInf(f, 0) && f != 0 {
			return lx.errf(line, "syntax error: invalid number %q", t)
		}
		lx.emit(token{kind: tNumber, text: t, line: line, isFloat: true, fval: f})
		return nil
	}
	if len(clean) > 1 && clean[0] == '0' && strings.Trim(clean, "0") != "" {
		return lx.errf(line, "syntax error: leading zeros in the integer %q (Python 3 writes octal as 0o)", t)
	}
	v, err := strconv.ParseInt(clean, 10, 64)
	if err != nil {
		return lx.cannot(line, fmt.Sprintf("the integer %s (larger than 64 bits)", t))
	}
	lx.emit(token{kind: tNumber, text: t, line: line, ival: v})
	return nil
}

// str reads a string literal at lx.i (the quote) with prefix p (lower case).
func (lx *lexer) str(p string) error {
	s := lx.src
	line := lx.line
	raw := strings.Contains(p, "r")
	if strings.Contains(p, "f") {
		return lx.cannot(line, "an f-string")
	}
	bytesLit := strings.Contains(p, "b")
	q := s[lx.i]
	triple := strings.HasPrefix(s[lx.i:], strings.Repeat(string(q), 3))
	if triple {
		lx.i += 3
	} else {
		lx.i++
	}
	var b strings.Builder
	for {
		if lx.i >= len(s) {
			return lx.errf(line, "syntax error: string literal is never closed")
		}
		c := s[lx.i]
		if c == q {
			if !triple {
				lx.i++
				break
			}
			if strings.HasPrefix(s[lx.i:], strings.Repeat(string(q), 3)) {
				lx.i += 3
				break
			}
			b.WriteByte(c)
			lx.i++
			continue
		}
		if c == '\n' || c == '\r' {
			if !triple {
				return lx.errf(line, "syntax error: string literal is never closed on its line")
			}
			lx.i++
			if c == '\r' && lx.i < len(s) && s[lx.i] == '\n' {
				lx.i++
			}
			b.WriteByte('\n') // universal newlines
			lx.line++
			continue
		}
		if c != '\\' {
			b.WriteByte(c)
			lx.i++
			continue
		}
		// backslash
		lx.i++
		if lx.i >= len(s) {
			return lx.errf(line, "syntax error: string literal is never closed")
		}
		e := s[lx.i]
		if e == '\n' || e == '\r' {
			lx.i++
			if e == '\r' && lx.i < len(s) && s[lx.i] == '\n' {
				lx.i++
			}
			lx.line++
			if raw {
				b.WriteString("\\\n")
			}
			continue
		}
		if raw {
			b.WriteByte('\\')
			r, n := utf8.DecodeRuneInString(s[lx.i:])
			b.WriteRune(r)
			lx.i += n
			continue
		}
		lx.i++
		switch e {
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(e - '0')
			for k := 0; k < 2 && lx.i < len(s) && s[lx.i] >= '0' && s[lx.i] <= '7'; k++ {
				v = v*8 + int(s[lx.i]-'0')
				lx.i++
			}
			b.WriteRune(rune(v))
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if e != 'x' && bytesLit {
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			if lx.i+n > len(s) {
				return lx.errf(lx.line, "syntax error: truncated \\%c escape", e)
			}
			h := s[lx.i : lx.i+n]
			v, err := strconv.ParseUint(h, 16, 32)
			if err != nil || strings.ContainsAny(h, "+-_") {
				return lx.errf(lx.line, "syntax error: truncated \\%c escape", e)
			}
			if v > unicode.MaxRune {
				return lx.errf(lx.line, "syntax error: illegal Unicode character \\%c%s", e, h)
			}
			b.WriteRune(rune(v))
			lx.i += n
		case 'N':
			if bytesLit {
				b.WriteString("\\N")
				continue
			}
			return lx.cannot(lx.line, `a \N{...} escape`)
		default:
			b.WriteByte('\\')
			lx.i-- // keep the character, whatever it is
			r, n := utf8.DecodeRuneInString(s[lx.i:])
			b.WriteRune(r)
			lx.i += n
		}
	}
	if bytesLit {
		return lx.cannot(line, "a bytes literal")
	}
	lx.emit(token{kind: tString, line: line, sval: b.String()})
	return nil
}

// ---------------------------------------------------------------------------
// Parser: statements are executed as they are read; expressions evaluate to
// Values.

var keywords = map[string]bool{
	"False": true, "None": true, "True": true, "and": true, "as": true, "assert": true, "async": true,
	"await": true, "break": true, "class": true, "continue": true, "def": true, "del": true, "elif": true,
	"else": true, "except": true, "finally": true, "for": true, "from": true, "global": true, "if": true,
	"import": true, "in": true, "is": true, "lambda": true, "nonlocal": true, "not": true, "or": true,
	"pass": true, "raise": true, "return": true, "try": true, "while": true, "with": true, "yield": true,
}

type parser struct {
	file   string
	toks   []token
	p      int
	names  map[string]*Value
	bound  map[string]bool
	order  []string
	depth  int
	nodes  int
	strLen int
}

// Parse reads a config file's Python. file names the file in positions and
// errors. The name tf is bound to tensorflow before the first line, as
// OpenSeq2Seq's run.py does (runpy.run_path(..., init_globals={'tf': tf})).
func Parse(file string, src []byte) (*Module, error) {
	toks, err := tokenize(file, src)
	if err != nil {
		return nil, err
	}
	ps := &parser{file: file, toks: toks, names: map[string]*Value{}, bound: map[string]bool{}}
	ps.names["tf"] = &Value{Kind: Symbol, Str: "tensorflow", Pos: at(file, 1)}
	if err := ps.module(); err != nil {
		return nil, err
	}
	if !ps.bound["tf"] {
		delete(ps.names, "tf")
	}
	return &Module{File: file, Names: ps.names, order: ps.order}, nil
}

func (ps *parser) tok() token { return ps.toks[ps.p] }

// peek returns the token k after the current one (EOF past the end).
func (ps *parser) peek(k int) token {
	if ps.p+k < len(ps.toks) {
		return ps.toks[ps.p+k]
	}
	return ps.toks[len(ps.toks)-1]
}

func (ps *parser) next() token {
	t := ps.toks[ps.p]
	if t.kind != tEOF {
		ps.p++
	}
	return t
}

func (ps *parser) isOp(s string) bool {
	t := ps.tok()
	return t.kind == tOp && t.text == s
}

func (ps *parser) isName(s string) bool {
	t := ps.tok()
	return t.kind == tName && t.text == s
}

func (ps *parser) cannot(line int, what string) error {
	return &Error{Pos: at(ps.file, line), Msg: "cannot read " + what + " " + subsetHint}
}

func (ps *parser) syntax(t token, want string) error {
	if t.kind == tError {
		return t.err
	}
	return &Error{Pos: at(ps.file, t.line), Msg: "syntax error: " + want + ", found " + describe(t)}
}

func describe(t token) string {
	switch t.kind {
	case tEOF:
		return "the end of the file"
	case tNewline:
		return "the end of the line"
	case tName:
		return "'" + t.text + "'"
	case tNumber:
		return "the number " + t.text
	case tString:
		return "a string"
	}
	return "'" + t.text + "'"
}

func (ps *parser) newValue(k Kind, line int) (*Value, error) {
	ps.nodes++
	if ps.nodes > maxNodes {
		return nil, ps.cannot(line, fmt.Sprintf("values this large (over %d of them)", maxNodes))
	}
	return &Value{Kind: k, Pos: at(ps.file, line)}, nil
}

func (ps *parser) module() error {
	for {
		t := ps.tok()
		switch {
		case t.kind == tEOF:
			return nil
		case t.kind == tNewline:
			ps.next()
			continue
		case t.kind == tError:
			return t.err
		}
		if err := ps.statement(); err != nil {
			return err
		}
		switch t := ps.tok(); {
		case t.kind == tNewline || t.kind == tEOF:
		case t.kind == tOp && t.text == ";":
			ps.next()
		default:
			if t.kind == tOp && (t.text == "=" || strings.HasSuffix(t.text, "=") && len(t.text) > 1 && t.text != "==" && t.text != "<=" && t.text != ">=" && t.text != "!=") {
				return ps.cannot(t.line, "an assignment to anything but a plain name")
			}
			if t.kind == tOp && t.text == "," {
				return ps.cannot(t.line, "a tuple assignment or a bare tuple")
			}
			return ps.syntax(t, "expected the end of the statement")
		}
	}
}

func (ps *parser) statement() error {
	t := ps.tok()
	if t.kind == tName {
		switch t.text {
		case "import":
			return ps.importStmt()
		case "from":
			return ps.fromStmt()
		case "True", "False", "None", "lambda", "not", "await":
			// expressions (an expression statement)
		default:
			if keywords[t.text] {
				return ps.cannot(t.line, "a '"+t.text+"' statement")
			}
			if n := ps.peek(1); n.kind == tOp && n.text == "=" {
				return ps.assign()
			}
			if n := ps.peek(1); n.kind == tOp && len(n.text) >= 2 && strings.HasSuffix(n.text, "=") && n.text != "==" && n.text != "<=" && n.text != ">=" && n.text != "!=" {
				return ps.cannot(t.line, "an augmented assignment ("+n.text+")")
			}
			if n := ps.peek(1); n.kind == tOp && n.text == ":" {
				return ps.cannot(t.line, "an annotated assignment")
			}
		}
	}
	// an assignment to something else than names (a, b = ...; a.b = ...)
	depth := 0
	for k := ps.p; k < len(ps.toks); k++ {
		tk := ps.toks[k]
		if tk.kind == tNewline || tk.kind == tEOF || tk.kind == tError || tk.kind == tOp && tk.text == ";" && depth == 0 {
			break
		}
		if tk.kind == tOp {
			switch tk.text {
			case "(", "[", "{":
				depth++
			case ")", "]", "}":
				depth--
			case "=":
				if depth == 0 {
					return ps.cannot(t.line, "an assignment to anything but a plain name")
				}
			}
		}
	}
	// an expression statement: only docstrings (string literals)
	onlyStrings := t.kind == tString
	for k := ps.p; onlyStrings && k < len(ps.toks) && ps.toks[k].kind == tString; k++ {
		if n := ps.toks[min(k+1, len(ps.toks)-1)]; n.kind != tString && n.kind != tNewline && n.kind != tEOF && !(n.kind == tOp && n.text == ";") {
			onlyStrings = false
		}
	}
	if _, err := ps.exprList(); err != nil {
		return err
	}
	if !onlyStrings {
		if n := ps.tok(); n.kind == tOp && (n.text == "=" || n.text == ",") {
			return ps.cannot(n.line, "an assignment to anything but a plain name")
		}
		return ps.cannot(t.line, "an expression statement (only docstrings stand alone)")
	}
	return nil
}

func (ps *parser) bind(name string, v *Value) {
	if !ps.bound[name] {
		ps.order = append(ps.order, name)
		ps.bound[name] = true
	}
	ps.names[name] = v
}

func (ps *parser) assign() error {
	var targets []token
	for {
		t, n := ps.tok(), ps.peek(1)
		if t.kind != tName || n.kind != tOp || n.text != "=" {
			break
		}
		if keywords[t.text] {
			return ps.syntax(t, "cannot assign to a keyword")
		}
		targets = append(targets, t)
		ps.p += 2
	}
	v, err := ps.exprList()
	if err != nil {
		return err
	}
	for _, t := range targets {
		ps.bind(t.text, v)
	}
	return nil
}

// dotted reads NAME ('.' NAME)*.
func (ps *parser) dotted() (string, error) {
	t := ps.next()
	if t.kind != tName || keywords[t.text] {
		return "", ps.syntax(t, "expected a module name")
	}
	name := t.text
	for ps.isOp(".") {
		ps.next()
		t := ps.next()
		if t.kind != tName || keywords[t.text] {
			return "", ps.syntax(t, "expected a name after '.'")
		}
		name += "." + t.text
	}
	return name, nil
}

func (ps *parser) identifier() (token, error) {
	t := ps.next()
	if t.kind != tName || keywords[t.text] {
		return t, ps.syntax(t, "expected a name")
	}
	return t, nil
}

// import a.b [as c], ...
func (ps *parser) importStmt() error {
	line := ps.next().line
	for {
		mod, err := ps.dotted()
		if err != nil {
			return err
		}
		if ps.isName("as") {
			ps.next()
			as, err := ps.identifier()
			if err != nil {
				return err
			}
			ps.bind(as.text, &Value{Kind: Symbol, Str: mod, Pos: at(ps.file, line)})
		} else {
			top, _, _ := strings.Cut(mod, ".")
			ps.bind(top, &Value{Kind: Symbol, Str: top, Pos: at(ps.file, line)})
		}
		if !ps.isOp(",") {
			return nil
		}
		ps.next()
	}
}

// from a.b import X [as Y], ... | from a.b import (X, Y,)
func (ps *parser) fromStmt() error {
	line := ps.next().line
	if ps.isOp(".") || ps.isOp("...") {
		return ps.cannot(line, "a relative import")
	}
	mod, err := ps.dotted()
	if err != nil {
		return err
	}
	if !ps.isName("import") {
		return ps.syntax(ps.tok(), "expected 'import'")
	}
	ps.next()
	if ps.isOp("*") {
		return ps.cannot(line, "'from "+mod+" import *' (the names it binds are unknown)")
	}
	paren := ps.isOp("(")
	if paren {
		ps.next()
	}
	for {
		if paren && ps.isOp(")") {
			break
		}
		name, err := ps.identifier()
		if err != nil {
			return err
		}
		bound := name.text
		if ps.isName("as") {
			ps.next()
			as, err := ps.identifier()
			if err != nil {
				return err
			}
			bound = as.text
		}
		if mod != "__future__" {
			ps.bind(bound, &Value{Kind: Symbol, Str: mod + "." + name.text, Pos: at(ps.file, line)})
		}
		if !ps.isOp(",") {
			break
		}
		ps.next()
		if !paren && (ps.tok().kind == tNewline || ps.tok().kind == tEOF) {
			return ps.syntax(ps.tok(), "trailing comma not allowed without parentheses")
		}
	}
	if paren {
		if !ps.isOp(")") {
			return ps.syntax(ps.tok(), "expected ')'")
		}
		ps.next()
	}
	return nil
}

// exprList reads expr (',' expr)* [','] — a tuple when there is a comma.
func (ps *parser) exprList() (*Value, error) {
	line := ps.tok().line
	v, err := ps.expr()
	if err != nil {
		return nil, err
	}
	if !ps.isOp(",") {
		return v, nil
	}
	tup, err := ps.newValue(Tuple, line)
	if err != nil {
		return nil, err
	}
	tup.Items = append(tup.Items, v)
	for ps.isOp(",") {
		ps.next()
		if t := ps.tok(); t.kind == tNewline || t.kind == tEOF || t.kind == tOp && (t.text == "=" || t.text == ";") {
			break
		}
		v, err := ps.expr()
		if err != nil {
			return nil, err
		}
		tup.Items = append(tup.Items, v)
	}
	return tup, nil
}

var unsupportedOps = map[string]string{
	"<": "a comparison", ">": "a comparison", "==": "a comparison", "!=": "a comparison",
	"<=": "a comparison", ">=": "a comparison", "&": "the operator &", "|": "the operator |",
	"^": "the operator ^", "<<": "a shift", ">>": "a shift", "@": "the operator @",
	":=": "an assignment expression", "~": "the operator ~",
}

func (ps *parser) enter(line int) error {
	ps.depth++
	if ps.depth > maxDepth {
		return ps.cannot(line, fmt.Sprintf("an expression nested more than %d deep", maxDepth))
	}
	return nil
}

func (ps *parser) expr() (*Value, error) {
	t := ps.tok()
	if err := ps.enter(t.line); err != nil {
		return nil, err
	}
	defer func() { ps.depth-- }()
	v, err := ps.arith()
	if err != nil {
		return nil, err
	}
	n := ps.tok()
	if n.kind == tName {
		switch n.text {
		case "if":
			return nil, ps.cannot(n.line, "a conditional expression (x if c else y)")
		case "and", "or", "in", "not", "is":
			return nil, ps.cannot(n.line, "the operator '"+n.text+"'")
		case "for", "async":
			return nil, ps.cannot(n.line, "a comprehension")
		}
	}
	if n.kind == tOp {
		if what, ok := unsupportedOps[n.text]; ok {
			return nil, ps.cannot(n.line, what)
		}
	}
	return v, nil
}

func (ps *parser) arith() (*Value, error) {
	v, err := ps.term()
	if err != nil {
		return nil, err
	}
	for ps.isOp("+") || ps.isOp("-") {
		op := ps.next()
		w, err := ps.term()
		if err != nil {
			return nil, err
		}
		if v, err = ps.binary(op, v, w); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func (ps *parser) term() (*Value, error) {
	v, err := ps.factor()
	if err != nil {
		return nil, err
	}
	for ps.isOp("*") || ps.isOp("/") || ps.isOp("//") || ps.isOp("%") {
		op := ps.next()
		w, err := ps.factor()
		if err != nil {
			return nil, err
		}
		if v, err = ps.binary(op, v, w); err != nil {
			return nil, err
		}
	}
	return v, nil
}

func (ps *parser) factor() (*Value, error) {
	t := ps.tok()
	if t.kind == tOp && (t.text == "-" || t.text == "+" || t.text == "~") {
		if err := ps.enter(t.line); err != nil {
			return nil, err
		}
		defer func() { ps.depth-- }()
		ps.next()
		v, err := ps.factor()
		if err != nil {
			return nil, err
		}
		if t.text == "~" {
			return nil, ps.cannot(t.line, "the operator ~")
		}
		return ps.unary(t, v)
	}
	if t.kind == tName && t.text == "not" {
		return nil, ps.cannot(t.line, "the operator 'not'")
	}
	if t.kind == tName && t.text == "lambda" {
		return nil, ps.cannot(t.line, "a lambda")
	}
	if t.kind == tName && t.text == "await" {
		return nil, ps.cannot(t.line, "'await'")
	}
	return ps.power()
}

func (ps *parser) power() (*Value, error) {
	v, err := ps.primary()
	if err != nil {
		return nil, err
	}
	if ps.isOp("**") {
		op := ps.next()
		w, err := ps.factor()
		if err != nil {
			return nil, err
		}
		return ps.binary(op, v, w)
	}
	return v, nil
}

// primary reads an atom and its trailers (attributes only).
func (ps *parser) primary() (*Value, error) {
	v, err := ps.atom()
	if err != nil {
		return nil, err
	}
	for {
		t := ps.tok()
		if t.kind != tOp {
			return v, nil
		}
		switch t.text {
		case ".":
			ps.next()
			name := ps.next()
			if name.kind != tName || keywords[name.text] {
				return nil, ps.syntax(name, "expected a name after '.'")
			}
			if v.Kind != Symbol {
				return nil, ps.cannot(t.line, "the attribute ."+name.text+" of "+v.Kind.a()+" (only attributes of imported names)")
			}
			w := &Value{Kind: Symbol, Str: v.Str + "." + name.text, Pos: v.Pos}
			v = w
		case "(":
			what := "a function call"
			if v.Kind == Symbol {
				what = "a call of " + v.Str + "(...)"
			}
			return nil, ps.cannot(t.line, what)
		case "[":
			return nil, ps.cannot(t.line, "a subscript ([...])")
		default:
			return v, nil
		}
	}
}

func (ps *parser) atom() (*Value, error) {
	t := ps.tok()
	switch t.kind {
	case tNumber:
		ps.next()
		if t.isFloat {
			v, err := ps.newValue(Float, t.line)
			if err != nil {
				return nil, err
			}
			v.Float = t.fval
			return v, nil
		}
		v, err := ps.newValue(Int, t.line)
		if err != nil {
			return nil, err
		}
		v.Int = t.ival
		return v, nil
	case tString:
		var b strings.Builder
		for ps.tok().kind == tString {
			b.WriteString(ps.next().sval)
		}
		return ps.strValue(b.String(), t.line)
	case tName:
		switch t.text {
		case "True", "False":
			ps.next()
			v, err := ps.newValue(Bool, t.line)
			if err != nil {
				return nil, err
			}
			v.Bool = t.text == "True"
			return v, nil
		case "None":
			ps.next()
			return ps.newValue(None, t.line)
		}
		if keywords[t.text] {
			return nil, ps.cannot(t.line, "the keyword '"+t.text+"' here")
		}
		ps.next()
		v, ok := ps.names[t.text]
		if !ok {
			if ps.isOp("(") {
				return nil, ps.cannot(t.line, "a call of "+t.text+"(...)")
			}
			return nil, ps.cannot(t.line, "the name "+t.text+": it is not assigned or imported before this line")
		}
		return ps.copyValue(v, t.line)
	case tOp:
		switch t.text {
		case "(":
			return ps.paren()
		case "[":
			return ps.list()
		case "{":
			return ps.dict()
		case "...":
			return nil, ps.cannot(t.line, "Ellipsis (...)")
		}
	}
	return nil, ps.syntax(t, "expected a value")
}

func (ps *parser) strValue(s string, line int) (*Value, error) {
	ps.strLen += len(s)
	if ps.strLen > maxStrBytes {
		return nil, ps.cannot(line, fmt.Sprintf("strings this long (over %d bytes in all)", maxStrBytes))
	}
	v, err := ps.newValue(Str, line)
	if err != nil {
		return nil, err
	}
	v.Str = s
	return v, nil
}

// copyValue copies v (a name's value) for use on line: the copy starts at
// line; what it contains keeps its own positions.
func (ps *parser) copyValue(v *Value, line int) (*Value, error) {
	c, err := ps.deepCopy(v, line)
	if err != nil {
		return nil, err
	}
	c.Pos = at(ps.file, line)
	return c, nil
}

func (ps *parser) deepCopy(v *Value, line int) (*Value, error) {
	ps.nodes++
	if ps.nodes > maxNodes {
		return nil, ps.cannot(line, fmt.Sprintf("values this large (over %d of them)", maxNodes))
	}
	if v.Kind == Str {
		ps.strLen += len(v.Str)
		if ps.strLen > maxStrBytes {
			return nil, ps.cannot(line, fmt.Sprintf("strings this long (over %d bytes in all)", maxStrBytes))
		}
	}
	c := *v
	if v.Items != nil {
		c.Items = make([]*Value, len(v.Items))
		for i, it := range v.Items {
			var err error
			if c.Items[i], err = ps.deepCopy(it, line); err != nil {
				return nil, err
			}
		}
	}
	if v.Dict != nil {
		c.Dict = make([]*Item, len(v.Dict))
		for i, it := range v.Dict {
			w, err := ps.deepCopy(it.Value, line)
			if err != nil {
				return nil, err
			}
			c.Dict[i] = &Item{Key: it.Key, KeyPos: it.KeyPos, Value: w, origin: it.origin}
		}
	}
	return &c, nil
}

func (ps *parser) closeOf(open token, close string) error {
	t := ps.tok()
	if t.kind == tOp && t.text == close {
		ps.next()
		return nil
	}
	if t.kind == tName && (t.text == "for" || t.text == "async") {
		return ps.cannot(t.line, "a comprehension")
	}
	if t.kind == tOp && t.text == ":" && close != "}" {
		return ps.cannot(t.line, "a slice or an annotation")
	}
	if t.kind == tOp && t.text == "=" {
		return ps.cannot(t.line, "a keyword argument or an assignment inside brackets")
	}
	return ps.syntax(t, fmt.Sprintf("expected ',' or '%s' (to close the '%s' of line %d)", close, open.text, open.line))
}

// paren reads (), (expr), (expr,) and (a, b, ...).
func (ps *parser) paren() (*Value, error) {
	open := ps.next()
	if err := ps.enter(open.line); err != nil {
		return nil, err
	}
	defer func() { ps.depth-- }()
	if ps.isOp(")") {
		ps.next()
		return ps.newValue(Tuple, open.line)
	}
	if ps.isOp("*") {
		return nil, ps.cannot(ps.tok().line, "unpacking (*)")
	}
	v, err := ps.expr()
	if err != nil {
		return nil, err
	}
	if !ps.isOp(",") {
		if err := ps.closeOf(open, ")"); err != nil {
			return nil, err
		}
		return v, nil
	}
	tup, err := ps.newValue(Tuple, open.line)
	if err != nil {
		return nil, err
	}
	tup.Items = []*Value{v}
	for ps.isOp(",") {
		ps.next()
		if ps.isOp(")") {
			break
		}
		if ps.isOp("*") {
			return nil, ps.cannot(ps.tok().line, "unpacking (*)")
		}
		w, err := ps.expr()
		if err != nil {
			return nil, err
		}
		tup.Items = append(tup.Items, w)
	}
	if err := ps.closeOf(open, ")"); err != nil {
		return nil, err
	}
	return tup, nil
}

func (ps *parser) list() (*Value, error) {
	open := ps.next()
	if err := ps.enter(open.line); err != nil {
		return nil, err
	}
	defer func() { ps.depth-- }()
	l, err := ps.newValue(List, open.line)
	if err != nil {
		return nil, err
	}
	l.Items = []*Value{}
	for !ps.isOp("]") {
		if ps.isOp("*") {
			return nil, ps.cannot(ps.tok().line, "unpacking (*)")
		}
		v, err := ps.expr()
		if err != nil {
			return nil, err
		}
		l.Items = append(l.Items, v)
		if !ps.isOp(",") {
			break
		}
		ps.next()
	}
	if err := ps.closeOf(open, "]"); err != nil {
		return nil, err
	}
	return l, nil
}

func (ps *parser) dict() (*Value, error) {
	open := ps.next()
	if err := ps.enter(open.line); err != nil {
		return nil, err
	}
	defer func() { ps.depth-- }()
	d, err := ps.newValue(Dict, open.line)
	if err != nil {
		return nil, err
	}
	d.Dict = []*Item{}
	index := map[string]int{}
	for !ps.isOp("}") {
		if ps.isOp("**") {
			return nil, ps.cannot(ps.tok().line, "dict unpacking (**)")
		}
		kt := ps.tok()
		k, err := ps.expr()
		if err != nil {
			return nil, err
		}
		if !ps.isOp(":") {
			if ps.isOp(",") || ps.isOp("}") {
				return nil, ps.cannot(kt.line, "a set literal")
			}
			return nil, ps.closeOf(open, "}")
		}
		ps.next()
		v, err := ps.expr()
		if err != nil {
			return nil, err
		}
		if k.Kind != Str {
			return nil, ps.cannot(kt.line, "a dict key that is "+k.Kind.a()+" ("+k.String()+"); keys must be strings")
		}
		if i, ok := index[k.Str]; ok {
			d.Dict[i].KeyPos, d.Dict[i].Value = at(ps.file, kt.line), v
		} else {
			index[k.Str] = len(d.Dict)
			d.Dict = append(d.Dict, &Item{Key: k.Str, KeyPos: at(ps.file, kt.line), Value: v})
		}
		if !ps.isOp(",") {
			break
		}
		ps.next()
	}
	if err := ps.closeOf(open, "}"); err != nil {
		return nil, err
	}
	return d, nil
}

func (ps *parser) unary(op token, v *Value) (*Value, error) {
	switch v.Kind {
	case Int:
		if op.text == "-" {
			if v.Int == math.MinInt64 {
				return nil, ps.cannot(op.line, "an integer larger than 64 bits")
			}
			v.Int = -v.Int
		}
	case Float:
		if op.text == "-" {
			v.Float = -v.Float
		}
	default:
		return nil, ps.cannot(op.line, "unary "+op.text+" on "+v.Kind.a()+" ("+v.String()+")")
	}
	v.Pos = at(ps.file, op.line)
	return v, nil
}

// binary applies + - * / // % ** as Python 3 does (true division; floor
// division and modulo take the sign of the divisor).
func (ps *parser) binary(op token, a, b *Value) (*Value, error) {
	bad := func() (*Value, error) {
		return nil, ps.cannot(op.line, fmt.Sprintf("%s %s %s (%s %s %s)", a.Kind, op.text, b.Kind, a, op.text, b))
	}
	out := func(k Kind) (*Value, error) {
		v, err := ps.newValue(k, op.line)
		if v != nil {
			v.Pos = a.Pos // an expression is where it starts
		}
		return v, err
	}
	switch {
	case a.Kind == Str && b.Kind == Str && op.text == "+":
		v, err := ps.strValue(a.Str+b.Str, op.line)
		if v != nil {
			v.Pos = a.Pos
		}
		return v, err
	case (a.Kind == List || a.Kind == Tuple) && a.Kind == b.Kind && op.text == "+":
		v, err := out(a.Kind)
		if err != nil {
			return nil, err
		}
		if ps.nodes += len(a.Items) + len(b.Items); ps.nodes > maxNodes {
			return nil, ps.cannot(op.line, fmt.Sprintf("values this large (over %d of them)", maxNodes))
		}
		v.Items = append(append(make([]*Value, 0, len(a.Items)+len(b.Items)), a.Items...), b.Items...)
		return v, nil
	case a.Kind == Int && b.Kind == Int:
		x, y := a.Int, b.Int
		var r int64
		ok := true
		switch op.text {
		case "+":
			r = x + y
			ok = (y >= 0) == (r >= x)
		case "-":
			r = x - y
			ok = (y >= 0) == (r <= x)
		case "*":
			r, ok = mulInt(x, y)
		case "/":
			if y == 0 {
				return nil, ps.cannot(op.line, "a division by zero")
			}
			v, err := out(Float)
			if err != nil {
				return nil, err
			}
			v.Float = float64(x) / float64(y)
			return v, nil
		case "//", "%":
			if y == 0 {
				return nil, ps.cannot(op.line, "a division by zero")
			}
			if x == math.MinInt64 && y == -1 {
				return nil, ps.cannot(op.line, "an integer larger than 64 bits")
			}
			q, m := x/y, x%y
			if m != 0 && (m < 0) != (y < 0) {
				q--
				m += y
			}
			r = q
			if op.text == "%" {
				r = m
			}
		case "**":
			if y < 0 {
				if x == 0 {
					return nil, ps.cannot(op.line, "a division by zero (0 ** negative)")
				}
				v, err := out(Float)
				if err != nil {
					return nil, err
				}
				v.Float = math.Pow(float64(x), float64(y))
				return v, nil
			}
			r, ok = powInt(x, y)
		}
		if !ok {
			return nil, ps.cannot(op.line, "an integer larger than 64 bits")
		}
		v, err := out(Int)
		if err != nil {
			return nil, err
		}
		v.Int = r
		return v, nil
	}
	x, okA := a.Number()
	y, okB := b.Number()
	if !okA || !okB {
		return bad()
	}
	var r float64
	switch op.text {
	case "+":
		r = x + y
	case "-":
		r = x - y
	case "*":
		r = x * y
	case "/", "//", "%":
		if y == 0 {
			return nil, ps.cannot(op.line, "a division by zero")
		}
		switch op.text {
		case "/":
			r = x / y
		case "//":
			r = floorDiv(x, y)
		default:
			r = math.Mod(x, y)
			if r != 0 && (r < 0) != (y < 0) {
				r += y
			}
		}
	case "**":
		if x == 0 && y < 0 {
			return nil, ps.cannot(op.line, "a division by zero (0 ** negative)")
		}
		if x < 0 && y != math.Trunc(y) {
			return nil, ps.cannot(op.line, "a complex result (negative ** fraction)")
		}
		r = math.Pow(x, y)
		if math.IsInf(r, 0) && !math.IsInf(x, 0) && !math.IsInf(y, 0) {
			return nil, ps.cannot(op.line, "a float overflow in **")
		}
	}
	v, err := out(Float)
	if err != nil {
		return nil, err
	}
	v.Float = r
	return v, nil
}

// floorDiv is CPython's float floor division.
func floorDiv(x, y float64) float64 {
	mod := math.Mod(x, y)
	div := (x - mod) / y
	if mod != 0 && (y < 0) != (mod < 0) {
		div -= 1
	}
	if div == 0 {
		return math.Copysign(0, x/y)
	}
	fd := math.Floor(div)
	if div-fd > 0.5 {
		fd++
	}
	return fd
}

func mulInt(x, y int64) (int64, bool) {
	if x == 0 || y == 0 {
		return 0, true
	}
	r := x * y
	if r/y != x || (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) {
		return 0, false
	}
	return r, true
}

func powInt(x, y int64) (int64, bool) {
	r := int64(1)
	for y > 0 {
		if y&1 == 1 {
			var ok bool
			if r, ok = mulInt(r, x); !ok {
				return 0, false
			}
		}
		y >>= 1
		if y > 0 { // a higher bit is set: x*x is used
			nx, ok := mulInt(x, x)
			if !ok {
				return 0, false
			}
			x = nx
		}
	}
	return r, true
}
