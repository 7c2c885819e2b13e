package words

import "testing"

func TestPlural(t *testing.T) {
	for _, c := range []struct {
		n    int
		want string
	}{{0, "0 ranks"}, {1, "1 rank"}, {2, "2 ranks"}, {-1, "-1 ranks"}} {
		if got := Plural(c.n, "rank"); got != c.want {
			t.Errorf("Plural(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
