package openseq2seq

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
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
	if !underscoresOK(t, 10) {
		return lx.errf(line, "syntax error: invalid number %q", t)
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
