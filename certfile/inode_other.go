//go:build !unix

package certfile

import "os"

// inode is unknown here: mtime and size alone tell a change.
func inode(os.FileInfo) uint64 { return 0 }
