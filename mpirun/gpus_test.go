package mpirun

import (
	"os"
	"path/filepath"
	"testing"
)

func TestVisibleDeviceWrapsAroundTheHostsGPUs(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-modeset", "null"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := devDir
	devDir = dir
	defer func() { devDir = old }()
	if g := HostGPUs(); g != 2 {
		t.Fatalf("hostGPUs = %d, want 2 (nvidia0, nvidia1; not nvidiactl or nvidia-uvm)", g)
	}
	for _, c := range []struct {
		local, gpus int
		want        string
	}{{0, 2, "0"}, {1, 2, "1"}, {2, 2, "0"}, {3, 2, "1"}, {1, 1, "0"}, {3, 0, "3"}} {
		if got := visibleDevice(c.local, c.gpus); got != c.want {
			t.Errorf("visibleDevice(%d, %d) = %s, want %s", c.local, c.gpus, got, c.want)
		}
	}
	devDir = filepath.Join(dir, "absent")
	if g := HostGPUs(); g != 0 {
		t.Fatalf("no /dev: hostGPUs = %d", g)
	}
}
