package openseq2seq

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ---------------------------------------------------------------------------
// Overrides (run.py's second argparse parser)

type leaf struct {
	path string
	it   *Item
}

// flatten lists base_params' entries as OpenSeq2Seq's flatten_dict does:
// nested dicts joined with '/'; only ints, floats, strings and bools can be
// overridden.
func flatten(prefix string, d *Value, all *[]leaf) {
	for _, it := range d.Dict {
		*all = append(*all, leaf{prefix + it.Key, it})
		if it.Value.Kind == Dict {
			flatten(prefix+it.Key+"/", it.Value, all)
		}
	}
}

// cmdPos is the position of a command-line argument (quoted when it has
// spaces or characters that would break the one-line message).
func cmdPos(arg string) Pos {
	q := strconv.Quote(arg)
	if q[1:len(q)-1] != arg || strings.ContainsAny(arg, " ") {
		arg = q
	}
	return Pos("command line " + arg)
}

func overridable(k Kind) bool { return k == Int || k == Float || k == Str || k == Bool }

// isNegNumber is argparse's test for an argument that looks like a negative
// number (and so is a value, not an option).
func isNegNumber(s string) bool {
	// argparse: '^-\d+$|^-\d*\.\d+$'
	if len(s) < 2 || s[0] != '-' {
		return false
	}
	intPart, frac, dot := strings.Cut(s[1:], ".")
	digits := func(t string) bool {
		for i := 0; i < len(t); i++ {
			if t[i] < '0' || t[i] > '9' {
				return false
			}
		}
		return true
	}
	if !dot {
		return digits(intPart)
	}
	return digits(intPart) && frac != "" && digits(frac)
}

func (ld *loader) override(base *Value, args []string) error {
	var leaves []leaf
	flatten("", base, &leaves)
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "--") || a == "--" || strings.HasPrefix(a, "--=") {
			return &Error{Pos: cmdPos(a), Msg: "unrecognized argument (run.py takes --KEY=VALUE for an entry of base_params)"}
		}
		key, val, hasVal := strings.Cut(a[2:], "=")
		if !hasVal {
			if i+1 < len(args) && (!strings.HasPrefix(args[i+1], "-") || isNegNumber(args[i+1])) {
				i++
				val = args[i]
				a = a + "=" + val
			} else {
				return &Error{Pos: cmdPos(a), Msg: "expected one argument (run.py reads --KEY=VALUE or --KEY VALUE; a bool takes True or False)"}
			}
		}
		pos := cmdPos(a)
		var match []leaf
		for _, l := range leaves {
			if l.path == key {
				match = []leaf{l}
				break
			}
			if strings.HasPrefix(l.path, key) && overridable(l.it.Value.Kind) {
				match = append(match, l) // argparse takes a unique prefix
			}
		}
		if len(match) > 1 {
			var names []string
			for _, l := range match {
				names = append(names, "--"+l.path)
			}
			return &Error{Pos: pos, Msg: fmt.Sprintf("ambiguous option: --%s could match %s (as run.py's argparse says)", key, strings.Join(names, ", "))}
		}
		if len(match) == 0 {
			return &Error{Pos: pos, Msg: fmt.Sprintf("unknown key %q: run.py overrides entries of base_params (nested keys joined with '/', e.g. lr_policy_params/learning_rate) that hold a number, a string or True/False", key)}
		}
		l := match[0]
		old := l.it.Value
		if old.Kind == Dict {
			return &Error{Pos: pos, Msg: fmt.Sprintf("key %q is a dict (%s): override one of its entries, --%s/KEY=VALUE", l.path, l.it.KeyPos, l.path)}
		}
		if !overridable(old.Kind) {
			return &Error{Pos: pos, Msg: fmt.Sprintf("key %q holds %s (%s), which run.py does not override from the command line: only numbers, strings and True/False", l.path, old, l.it.KeyPos)}
		}
		nv := &Value{Kind: old.Kind, Pos: pos}
		switch old.Kind {
		case Int:
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil {
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q is not an int (%s is %s at %s)", val, l.path, old, l.it.KeyPos)}
			}
			nv.Int = n
		case Float:
			t := strings.TrimSpace(val)
			f, err := strconv.ParseFloat(t, 64)
			if err != nil && !math.IsInf(f, 0) || strings.ContainsAny(t, "xX_") {
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q is not a float (%s is %s at %s)", val, l.path, old, l.it.KeyPos)}
			}
			nv.Float = f
		case Str:
			nv.Str = val
		case Bool:
			switch strings.TrimSpace(val) {
			case "True":
				nv.Bool = true
			case "False":
			default:
				return &Error{Pos: pos, Msg: fmt.Sprintf("%q: want True or False (run.py reads bools with ast.literal_eval)", val)}
			}
		}
		l.it.Value, l.it.KeyPos = nv, pos
	}
	return nil
}
