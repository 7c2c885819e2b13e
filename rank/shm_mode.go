package rank

import (
	"fmt"
	"os"
	"strings"
)

// EnvShm turns shared memory between same-host ranks off ("0", "off",
// "false") or on ("1", "on", "true"; the default).
const EnvShm = "GORUN_SHM"

// EnvShmGroup set to 0 on a host's lowest rank leaves the host without a
// group segment (rank.LocalGroup), so collectives use the pair rings.
const EnvShmGroup = "GORUN_SHM_GROUP"

// shmEnabled resolves Options.SharedMemory with GORUN_SHM.
func shmEnabled(opt string) (bool, error) {
	v := strings.ToLower(strings.TrimSpace(opt))
	src := "Options.SharedMemory"
	if v == "" || v == "auto" {
		v = strings.ToLower(strings.TrimSpace(os.Getenv(EnvShm)))
		src = EnvShm
	}
	switch v {
	case "", "auto", "1", "on", "true", "yes":
		return true, nil
	case "0", "off", "false", "no":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want on or off (1 or 0)", src, v)
}
