package certfile

import (
	"os"
	"time"
)

// stamp is what the poll compares of a file: a new inode is a file replaced by rename (how cert-manager's
// and Kubernetes' secret volumes swap a symlink), a new mtime or size one written in place.
type stamp struct {
	mod  time.Time
	size int64
	ino  uint64
	err  bool // the file could not be looked at
}

// stampOf stats path (following symlinks, so a swapped link target counts as a change).
func stampOf(path string) stamp {
	if path == "" {
		return stamp{}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return stamp{err: true}
	}
	return stamp{mod: fi.ModTime(), size: fi.Size(), ino: inode(fi)}
}
