package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestStoreFileMode: a new store and the logs SQLite creates beside it are readable by their owner only,
// whatever the umask lets through.
func TestStoreFileMode(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "rolter.db")
	s := openStore(t, path)
	mustOrg(t, s, "o")
	f := func(path string) {
		t.Helper()
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v, want 0600", filepath.Base(path), st.Mode().Perm())
		}
	}
	f(path)
	f(path + "-wal")
	f(path + "-shm")
}

// storeWithPages returns the path of a closed store of several dozen pages (providers with 1 KiB configs).
func storeWithPages(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rolter.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	o := mustOrg(t, s, "o")
	for i := 0; i < 100; i++ {
		cfg := fmt.Appendf(nil, `{"i":%d,"pad":%q}`, i, strings.Repeat("x", 1000))
		if err := s.CreateProvider(bg, su, o.ID, fmt.Sprintf("p%03d", i), cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing the last connection checkpoints the log into the file and removes it: the file is the store.
	if _, err := os.Stat(path + "-wal"); !os.IsNotExist(err) {
		t.Fatalf("the log outlived Close: %v", err)
	}
	return path
}

// refused opens path, wants an error saying each of parts, and wants the file left byte for byte as it
// was, also at a second attempt.
func refused(t *testing.T, path string, parts ...string) {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; attempt < 2; attempt++ {
		s, err := Open(path)
		if err == nil {
			s.Close()
			t.Fatalf("Open accepted the file")
		}
		for _, p := range parts {
			if !strings.Contains(err.Error(), p) {
				t.Fatalf("Open error %q does not say %q", err, p)
			}
		}
		if attempt == 0 {
			t.Logf("refused: %v", err)
		}
		after, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(before, after) {
			t.Fatalf("the refused file was changed")
		}
	}
}

func TestStoreRefuseNewerSchema(t *testing.T) {
	path := storeWithPages(t)
	raw := rawDB(t, path)
	if _, err := raw.Exec(fmt.Sprintf("PRAGMA user_version = %d", SchemaVersion()+1)); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	abs, _ := filepath.Abs(path)
	refused(t, path, fmt.Sprintf("store %s has schema version %d; this rolter knows up to %d: upgrade rolter, never downgrade a store", abs, SchemaVersion()+1, SchemaVersion()))
}

func TestStoreRefuseNotSQLite(t *testing.T) {
	dir := t.TempDir()
	f := func(name string, content []byte, parts ...string) {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, content, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(t, path, parts...)
	}
	random := make([]byte, 8192)
	r := rand.NewChaCha8([32]byte{1})
	r.Read(random)
	f("random", random, "not a SQLite database")
	f("text", []byte("[server]\nlisten = \":8080\"\n"), "not a SQLite database", `"[server]\nlisten "`)
	f("short", []byte(sqliteMagic+"abc"), "not a SQLite database (19 bytes, shorter than the header)")

	// A SQLite database of another program is not migrated into a store.
	other := filepath.Join(dir, "other.db")
	raw := rawDB(t, other)
	if _, err := raw.Exec("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me')"); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	refused(t, other, "a SQLite database but not a rolter store", "1 schema objects")
	raw = rawDB(t, other)
	if _, err := raw.Exec("DROP TABLE notes; PRAGMA application_id = 42"); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	refused(t, other, "a SQLite database but not a rolter store", "application_id 0x2a")
	raw = rawDB(t, other)
	if _, err := raw.Exec("PRAGMA user_version = 1"); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	refused(t, other, "a SQLite database but not a rolter store", "application_id 0x2a, want 0x726f6c74")

	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Open of a directory: %v", err)
	}
}

// TestStoreRefuseCorrupt: a store with a page overwritten, or cut short, fails quick_check and is refused,
// not reset.
func TestStoreRefuseCorrupt(t *testing.T) {
	f := func(name string, corrupt func(t *testing.T, path string, pageSize, pages int)) {
		t.Run(name, func(t *testing.T) {
			path := storeWithPages(t)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			pageSize := int(binary.BigEndian.Uint16(b[16:18])) // https://www.sqlite.org/fileformat2.html, 1.3.2
			if pageSize == 1 {
				pageSize = 65536
			}
			if len(b)%pageSize != 0 || len(b)/pageSize < 20 {
				t.Fatalf("%d bytes in pages of %d: not the store this test needs", len(b), pageSize)
			}
			corrupt(t, path, pageSize, len(b)/pageSize)
			refused(t, path, "restore it from a backup")
		})
	}
	f("page overwritten", func(t *testing.T, path string, pageSize, pages int) {
		garbage := make([]byte, pageSize)
		r := rand.NewChaCha8([32]byte{2})
		r.Read(garbage)
		fd, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		if _, err := fd.WriteAt(garbage, int64(pages/2*pageSize)); err != nil {
			t.Fatal(err)
		}
	})
	f("truncated", func(t *testing.T, path string, pageSize, pages int) {
		if err := os.Truncate(path, int64(pages/2*pageSize)); err != nil {
			t.Fatal(err)
		}
	})
	f("header page overwritten past the magic", func(t *testing.T, path string, pageSize, pages int) {
		b, _ := os.ReadFile(path)
		r := rand.NewChaCha8([32]byte{3})
		r.Read(b[100:pageSize]) // the schema table's root page, after the file header
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

// TestStoreRefuseOrphanLog: a log whose database file is gone is not read into a new, empty store.
func TestStoreRefuseOrphanLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.db")
	if err := os.WriteFile(path+"-wal", []byte("frames"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(path)
	if err == nil || !strings.Contains(err.Error(), "the file is missing but") {
		t.Fatalf("Open beside an orphan log: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("a store file was created beside the orphan log: %v", err)
	}
}

// TestStoreEmptyFile: an empty file (what an Open stopped before its first write leaves) becomes a store.
func TestStoreEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rolter.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, path)
	mustOrg(t, s, "o")
	if _, err := Open(filepath.Join(filepath.Dir(path), "missing", "rolter.db")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Open in a missing directory: %v", err)
	}
}

// TestStorePathCharacters: a path is a path, not a URI: characters URIs give meaning to stay in the name.
func TestStorePathCharacters(t *testing.T) {
	dir := t.TempDir()
	f := func(name string) {
		t.Helper()
		path := filepath.Join(dir, name)
		s, err := Open(path)
		if err != nil {
			t.Fatalf("Open(%q): %v", name, err)
		}
		mustOrg(t, s, "o")
		s.Close()
		if st, err := os.Stat(path); err != nil || st.Size() == 0 {
			t.Fatalf("%q: the store is not at its path: %v", name, err)
		}
	}
	f("plain.db")
	f("with space.db")
	f("q?mode=ro&vfs=x.db")
	f("hash#frag.db")
	f("pct%20.db")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 5 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("files %q; want the five stores and nothing else", names)
	}
}
