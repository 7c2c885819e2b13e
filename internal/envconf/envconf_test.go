package envconf

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/collective"
)

func lookup(env map[string]string) Lookup {
	return func(name string) (string, bool) { v, ok := env[name]; return v, ok }
}

// Every collective variable reaches its Config field; unset ones leave
// the zero value (the library's default); a malformed one is an error
// naming it.
func TestCollective(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want collective.Config
		err  string
	}{
		{env: nil},
		{env: map[string]string{Allreduce: "tree"}, want: collective.Config{Algorithm: collective.Tree}},
		{env: map[string]string{Allreduce: "hd"}, want: collective.Config{Algorithm: collective.HalvingDoubling}},
		{env: map[string]string{Allreduce: ""}, want: collective.Config{Algorithm: collective.Auto}},
		{env: map[string]string{Allreduce: "butterfly"}, err: "GORUN_ALLREDUCE: unknown allreduce algorithm \"butterfly\""},
		{env: map[string]string{SliceBytes: "4096", Rings: "3"}, want: collective.Config{SliceBytes: 4096, Channels: 3}},
		{env: map[string]string{SliceBytes: "12x"}, err: `GORUN_SLICE_BYTES="12x": want an integer >= 64`},
		{env: map[string]string{SliceBytes: "8"}, err: `GORUN_SLICE_BYTES="8": want an integer >= 64`},
		{env: map[string]string{Rings: "0"}, err: `GORUN_RINGS="0": want an integer >= 1`},
		{env: map[string]string{Hierarchical: "0"}, want: collective.Config{Flat: true}},
		{env: map[string]string{Hierarchical: "1"}},
		{env: map[string]string{SharedRound: "65536"}, want: collective.Config{SharedRoundBytes: 65536}},
		{env: map[string]string{SharedRound: "100"}},
		{env: map[string]string{SharedRound: "lots"}},
	} {
		got, err := Collective(lookup(c.env))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: want an error %q, got %v", c.env, c.err, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: got %+v, %v; want %+v", c.env, got, err, c.want)
		}
	}
}
