// Package testenv holds what the process tests of several packages share:
// an environment free of launcher variables, a free loopback port, and a
// buffer for the output of running processes.
package testenv

import (
	"bytes"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
)

// CleanEnv is this process's environment without the variables by which
// gorun, OpenMPI, Slurm or torchrun identify a rank, so a test decides
// alone what identity the processes it starts get.
func CleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GORUN_") || strings.HasPrefix(k, "OMPI_") || strings.HasPrefix(k, "SLURM_") ||
			strings.HasPrefix(k, "TORCHELASTIC_") || strings.HasPrefix(k, "PMIX_") ||
			k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" || k == "MASTER_ADDR" || k == "MASTER_PORT" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// FreeUDPPort returns a UDP port on 127.0.0.1 that was free a moment ago
// (for a rendezvous the processes under test serve themselves).
func FreeUDPPort(t testing.TB) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, port, _ := net.SplitHostPort(c.LocalAddr().String())
	return port
}

// Buffer collects a process's output while the test reads it: a
// bytes.Buffer safe for concurrent writes and reads.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
