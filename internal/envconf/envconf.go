// Package envconf reads gorun's environment variables at a program's edge:
// a command calls it once with os.LookupEnv, and the libraries get what it
// read in their Config structs. A malformed value is an error that names
// the variable; an unset one leaves the library's default.
package envconf

import (
	"fmt"
	"strconv"

	"github.com/gorun/gorun/collective"
)

// Lookup is os.LookupEnv, or a map's lookup in tests.
type Lookup func(name string) (string, bool)

// The collectives' variables (docs/collective.md). Every rank of a job
// must be given the same values.
const (
	Allreduce    = "GORUN_ALLREDUCE"    // ring | tree | direct | shm | hd | rd | auto
	SliceBytes   = "GORUN_SLICE_BYTES"  // pipeline slice size in bytes (>= 64)
	Rings        = "GORUN_RINGS"        // channels (rings, trees) used in parallel (>= 1)
	Hierarchical = "GORUN_HIERARCHICAL" // 0: no two-level allreduce
	SharedRound  = "GORUN_SHM_ROUND"    // bytes a round of the shared-memory allreduce handles (>= 4096)
)

// Collective is the collective.Config the variables above ask for.
// GORUN_SHM_ROUND below 4096 or not a number is ignored, as it always was.
func Collective(get Lookup) (collective.Config, error) {
	var cfg collective.Config
	if v, ok := get(Allreduce); ok {
		a, err := collective.ParseAlgorithm(v)
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", Allreduce, err)
		}
		cfg.Algorithm = a
	}
	var err error
	if cfg.SliceBytes, err = atLeast(get, SliceBytes, 64); err != nil {
		return cfg, err
	}
	if cfg.Channels, err = atLeast(get, Rings, 1); err != nil {
		return cfg, err
	}
	if v, _ := get(Hierarchical); v == "0" {
		cfg.Flat = true
	}
	if v, _ := get(SharedRound); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n >= 4096 {
			cfg.SharedRoundBytes = n
		}
	}
	return cfg, nil
}

// atLeast reads name as an integer of at least lo; unset or empty is 0.
func atLeast(get Lookup, name string, lo int) (int, error) {
	v, _ := get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo {
		return 0, fmt.Errorf("%s=%q: want an integer >= %d", name, v, lo)
	}
	return n, nil
}
