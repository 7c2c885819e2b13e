package mpirun

import (
	"os"
	"regexp"
	"strconv"
)

// devDir is where the NVIDIA driver's device nodes are (/dev/nvidia0,
// /dev/nvidia1, ...); a variable so the tests can point it elsewhere.
var devDir = "/dev"

var nvidiaNode = regexp.MustCompile(`^nvidia[0-9]+$`)

// HostGPUs counts the GPUs of this host by their device nodes: no driver
// call, so gorun itself needs no CUDA.
func HostGPUs() int {
	ents, err := os.ReadDir(devDir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if nvidiaNode.MatchString(e.Name()) {
			n++
		}
	}
	return n
}

// visibleDevice is the CUDA_VISIBLE_DEVICES gorun gives a rank with this
// local rank on a host with gpus GPUs: one GPU per local rank, wrapping
// around when the ranks outnumber the GPUs (they share), and the local
// rank itself on a host where no GPU was seen.
func visibleDevice(local, gpus int) string {
	if gpus > 0 {
		local %= gpus
	}
	return strconv.Itoa(local)
}
