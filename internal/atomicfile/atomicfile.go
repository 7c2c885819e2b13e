// Package atomicfile replaces files so that a crash leaves either the old
// file or the whole new one, never a part: the new bytes go to a temporary
// file in the same directory, which is fsynced and renamed over the path,
// and then the directory itself is fsynced so that the rename survives a
// crash too. google/renameio does the first part but not the directory's
// fsync, which a checkpoint that `latest` names needs, so gorun keeps this
// small package instead of a dependency.
package atomicfile

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
)

// WriteFile replaces path with data. The temporary file is named by
// pattern (as os.CreateTemp's: its last "*" becomes random digits) in
// path's directory. A new file gets mode 0644 less the umask, as os.Create
// gives; a replaced file keeps its mode. On error the temporary file is
// removed and path is as it was.
func WriteFile(path, pattern string, data []byte) error {
	dir := filepath.Dir(path)
	perm := fs.FileMode(0o644)
	keep := false
	if fi, err := os.Stat(path); err == nil {
		perm, keep = fi.Mode().Perm(), true
	}
	f, err := create(dir, pattern, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && keep {
		err = f.Chmod(perm) // exactly the old mode, whatever the umask
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return err
	}
	return SyncDir(dir)
}

// MkdirTemp makes a new directory in dir named by pattern (as
// os.MkdirTemp's), with mode 0755 less the umask (os.MkdirTemp's are 0700):
// a directory to be filled and then renamed into place.
func MkdirTemp(dir, pattern string) (string, error) {
	for range 100 {
		name := filepath.Join(dir, randomName(pattern))
		err := os.Mkdir(name, 0o755)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("atomicfile: no free name for %s in %s", pattern, dir)
}

// SyncDir fsyncs the directory dir, making the renames into it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// create opens a new file named by pattern in dir for writing, with perm
// less the umask.
func create(dir, pattern string, perm fs.FileMode) (*os.File, error) {
	for range 100 {
		f, err := os.OpenFile(filepath.Join(dir, randomName(pattern)), os.O_RDWR|os.O_CREATE|os.O_EXCL, perm)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return nil, err
		}
	}
	return nil, fmt.Errorf("atomicfile: no free name for %s in %s", pattern, dir)
}

// randomName replaces pattern's last "*" with random digits, or appends
// them where it has none.
func randomName(pattern string) string {
	r := fmt.Sprint(rand.Uint32())
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		return pattern[:i] + r + pattern[i+1:]
	}
	return pattern + r
}
