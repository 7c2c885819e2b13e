//go:build unix && !linux

package mpirun

import "syscall"

// procAttr starts a process in its own process group (so that a signal
// reaches everything it started). Without Linux's parent-death signal, the
// remote agent's stdin and gorun's own cleanup are what stop orphans.
func procAttr(syscall.Signal) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
