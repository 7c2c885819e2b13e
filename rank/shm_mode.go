package rank

import (
	"fmt"
	"strings"
)

// EnvShm turns shared memory between same-host ranks off ("0", "off",
// "false") or on ("1", "on", "true"; the default).
const EnvShm = "GORUN_SHM"

// EnvShmGroup set to 0 on a host's lowest rank leaves the host without a
// group segment (rank.LocalGroup), so collectives use the pair rings.
const EnvShmGroup = "GORUN_SHM_GROUP"

// shmEnabled resolves Options.SharedMemory.
func shmEnabled(opt string) (bool, error) {
	return ParseShm("Options.SharedMemory", opt)
}

// ParseShm reads a shared-memory setting (Options.SharedMemory, or
// GORUN_SHM's value): on (also "", "auto", 1, true, yes) or off (0, false,
// no), in any case and with spaces around; src names where it came from in
// the error.
func ParseShm(src, v string) (bool, error) {
	v = strings.ToLower(strings.TrimSpace(v))
	switch v {
	case "", "auto", "1", "on", "true", "yes":
		return true, nil
	case "0", "off", "false", "no":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want on or off (1 or 0)", src, v)
}
