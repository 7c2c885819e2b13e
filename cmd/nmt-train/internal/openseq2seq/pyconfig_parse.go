package openseq2seq

import (
	"fmt"
	"strings"
)

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
