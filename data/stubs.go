package data

import (
		"errors"
)

var errTODO = errors.New("data: not implemented yet")

// Synthetic generates the built-in corpus.
func Synthetic(seed int64, n int) (src, tgt []string) { return nil, nil }

