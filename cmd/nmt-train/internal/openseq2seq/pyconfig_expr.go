package openseq2seq

import (
	"fmt"
	"strings"
)

// ---------------------------------------------------------------------------
// Expressions: each evaluates to a Value as it is read.

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
