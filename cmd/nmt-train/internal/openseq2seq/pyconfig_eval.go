package openseq2seq

import (
	"fmt"
	"math"
)

// ---------------------------------------------------------------------------
// Operators: Python 3's arithmetic on Values.

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
