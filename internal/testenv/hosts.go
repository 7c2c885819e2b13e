package testenv

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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

// LockSlot takes the first free slot, 1..8, of a kind of test fixture
// ("multihost", "slurm"): an exclusive lock on /tmp/gorun-KIND-N.lock, so
// that test runs side by side make fixtures of their own. The file holds
// the lock until it is closed (or handed to a Watchdog).
func LockSlot(kind string) (*os.File, int, error) {
	for slot := 1; slot <= 8; slot++ {
		f, err := os.OpenFile(fmt.Sprintf("/tmp/gorun-%s-%d.lock", kind, slot), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, 0, err
		}
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			return f, slot, nil
		}
		f.Close()
	}
	return nil, 0, fmt.Errorf("all 8 %s slots (/tmp/gorun-%s-N.lock) are taken by other test runs", kind, kind)
}

// Watchdog starts a process that runs down (a fixture's down.sh) with
// env and removes paths once this process ends, however it ends, holding
// lock until then. It runs in its own process group, so that ^C reaches
// the tests and not it. stop runs it now and waits for it, up to wait.
func Watchdog(down string, env []string, lock *os.File, wait time.Duration, paths ...string) (stop func(), err error) {
	wd := exec.Command("bash", append([]string{"-c", `read -r _; "$0" >/dev/null 2>&1; rm -rf "$@"`, down}, paths...)...)
	wd.Env = env
	wd.ExtraFiles = []*os.File{lock}
	wd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, err := wd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := wd.Start(); err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	lock.Close() // the watchdog holds it now
	var once sync.Once
	return func() {
		once.Do(func() {
			in.Close()
			done := make(chan error, 1)
			go func() { done <- wd.Wait() }()
			select {
			case <-done:
			case <-time.After(wait):
				fmt.Fprintf(os.Stderr, "%s did not finish in %v\n", down, wait)
			}
		})
	}, nil
}
