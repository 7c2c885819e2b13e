package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// LookPath finds a program in PATH, then in /usr/sbin and /sbin (where
// sshd, slurmd and the like live, and a non-login root PATH may lack).
func LookPath(name string) (string, bool) {
	if p, err := exec.LookPath(name); err == nil {
		return p, true
	}
	for _, d := range []string{"/usr/sbin", "/sbin"} {
		if _, err := os.Stat(filepath.Join(d, name)); err == nil {
			return filepath.Join(d, name), true
		}
	}
	return "", false
}

// NetnsRefused says why this process cannot make a network namespace
// (`ip netns add` fails: root without CAP_SYS_ADMIN/CAP_NET_ADMIN, an
// unprivileged container), or "" when it can; it makes one and removes it.
func NetnsRefused() string {
	probe := fmt.Sprintf("gorun-probe-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", probe).CombinedOutput(); err != nil {
		return fmt.Sprintf("`ip netns add`: %v: %s", err, strings.TrimSpace(string(out)))
	}
	exec.Command("ip", "netns", "del", probe).Run()
	return ""
}

// RunTimeout runs c, its stdout and stderr together, and kills it after d.
func RunTimeout(c *exec.Cmd, d time.Duration) (string, error) {
	var buf bytes.Buffer
	c.Stdout, c.Stderr = &buf, &buf
	if err := c.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return buf.String(), err
	case <-time.After(d):
		c.Process.Kill()
		<-done
		return buf.String(), fmt.Errorf("%s did not finish in %v", c.Path, d)
	}
}
