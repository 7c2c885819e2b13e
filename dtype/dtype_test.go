package dtype

import "testing"

func TestParseReadsEveryFloatTypeByEachName(t *testing.T) {
	for _, d := range []DType{Float32, Float16, BFloat16} {
		got, err := Parse(d.String())
		if err != nil || got != d {
			t.Errorf("Parse(%q) = %v, %v; want %v", d.String(), got, err, d)
		}
	}
	for s, want := range map[string]DType{"float": Float32, "fp32": Float32, "half": Float16, "f16": Float16, "bf16": BFloat16} {
		if got, err := Parse(s); err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "int32", "uint8", "FP16", "double"} {
		if got, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", s, got)
		}
	}
}

func TestSizeAndFloat(t *testing.T) {
	for _, c := range []struct {
		d     DType
		size  int
		float bool
	}{{Float32, 4, true}, {Float16, 2, true}, {BFloat16, 2, true}, {Int32, 4, false}, {Uint8, 1, false}, {0, 0, false}, {9, 0, false}} {
		if c.d.Size() != c.size || c.d.Float() != c.float {
			t.Errorf("%v: Size %d Float %v; want %d %v", c.d, c.d.Size(), c.d.Float(), c.size, c.float)
		}
	}
	if s := DType(0).String(); s != "dtype(0)" {
		t.Errorf("the unset type reads %q", s)
	}
}
