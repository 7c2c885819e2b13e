package mpirun

import "syscall"

// procAttr starts a rank in its own process group (so that a signal reaches
// everything it started) and kills it if its parent (gorun, or the remote
// agent) dies without cleaning up.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
