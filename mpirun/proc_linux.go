package mpirun

import "syscall"

// procAttr starts a process in its own process group (so that a signal
// reaches everything it started) and sends it deathSig if its parent (gorun,
// or the remote agent) dies without cleaning up: SIGKILL for a rank, SIGTERM
// for an ssh or launch agent (so that the remote agent still stops its rank).
func procAttr(deathSig syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig}
}
