package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestImage builds rolter from the repository, assembles its image as `make image` does, reads the OCI
// layout back, checks the config and the layer's files, and runs the binary from the extracted layer
// alone: chrooted into it (as root), or through the layer's own loader and libraries.
func TestImage(t *testing.T) {
	dir := t.TempDir()
	binary := filepath.Join(dir, "rolter")
	build := exec.Command("go", "build", "-ldflags", "-X main.version=v9.9.9-test", "-o", binary, "./cmd/rolter")
	build.Dir = filepath.Join("..", "..")
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	layoutDir, tarPath := filepath.Join(dir, "layout"), filepath.Join(dir, "rolter-image.tar")
	if err := run(binary, "v9.9.9-test", layoutDir, tarPath); err != nil {
		t.Fatal(err)
	}

	// The layout holds one image, tagged; its digests are the ones its index names.
	p, err := layout.FromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil || len(im.Manifests) != 1 || im.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v9.9.9-test" {
		t.Fatalf("index %+v: %v", im, err)
	}
	img, err := p.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := img.Digest(); d != im.Manifests[0].Digest {
		t.Fatalf("image digest %s, index says %s", d, im.Manifests[0].Digest)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || !slices.Equal(c.Entrypoint, []string{"/usr/local/bin/rolter"}) ||
		!slices.Equal(c.Cmd, []string{"serve", "-config", "/etc/rolter/rolter.toml"}) || len(c.ExposedPorts) != 2 ||
		c.Labels["org.opencontainers.image.version"] != "v9.9.9-test" || cf.OS != "linux" {
		t.Fatalf("image config %+v", cf)
	}

	// The layer: the binary, every library ldd lists, the accounts; extracted into a root of its own.
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers: %v", len(layers), err)
	}
	root := filepath.Join(dir, "root")
	names := extract(t, layers[0], root)
	libs, err := sharedLibraries(binary)
	if err != nil || len(libs) < 3 {
		t.Fatalf("ldd lists %v: %v", libs, err)
	}
	for _, want := range append([]string{"usr/local/bin/rolter", "etc/passwd", "etc/group", "var/lib/rolter/", "tmp/"}, trimAll(libs)...) {
		if !slices.Contains(names, want) {
			t.Errorf("the layer lacks %s", want)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/passwd")); !strings.Contains(string(b), "rolter:x:65532:65532:") {
		t.Errorf("passwd: %s", b)
	}

	// The binary runs from the layer alone.
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("chroot", root, "/usr/local/bin/rolter", "version")
	} else {
		loader := slices.IndexFunc(libs, func(l string) bool { return strings.Contains(l, "/ld-linux") })
		if loader < 0 {
			t.Skip("no loader in ldd's list to run the binary through")
		}
		var dirs []string
		for _, l := range libs {
			dirs = append(dirs, filepath.Join(root, filepath.Dir(l)))
		}
		cmd = exec.Command(filepath.Join(root, libs[loader]), "--library-path", strings.Join(dirs, ":"), filepath.Join(root, "usr/local/bin/rolter"), "version")
	}
	cmd.Env = []string{"PATH=/usr/local/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "rolter v9.9.9-test" {
		t.Fatalf("%v: %q %v", cmd.Args, out, err)
	}

	// A container engine, where one runs here, loads and runs the docker archive.
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Logf("no podman: the docker archive is not loaded")
		return
	}
	if out, err := exec.Command(podman, "load", "-i", tarPath).CombinedOutput(); err != nil {
		t.Logf("podman load cannot run here (%v): %s", err, lastLine(out))
		return
	}
	defer exec.Command(podman, "rmi", "-f", "rolter:v9.9.9-test").Run()
	out, err = exec.Command(podman, "run", "--rm", "--network=none", "rolter:v9.9.9-test", "version").CombinedOutput()
	if err != nil {
		t.Logf("podman run cannot run here (%v): %s", err, lastLine(out))
		return
	}
	if strings.TrimSpace(string(out)) != "rolter v9.9.9-test" {
		t.Fatalf("podman run: %q", out)
	}
}

// extract writes the layer's files under root and returns their names.
func extract(t *testing.T, l interface{ Uncompressed() (io.ReadCloser, error) }, root string) []string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		p := filepath.Join(root, h.Name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			var b []byte
			if b, err = io.ReadAll(tr); err == nil {
				err = os.WriteFile(p, b, os.FileMode(h.Mode).Perm())
			}
		default:
			t.Fatalf("%s: unexpected entry type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func trimAll(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = strings.TrimPrefix(p, "/")
	}
	return out
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// TestParseLdd: ldd's three kinds of lines, and a missing library refused.
func TestParseLdd(t *testing.T) {
	libs, err := parseLdd("\tlinux-vdso.so.1 (0x00007ffd1c9f5000)\n\tlibzmq.so.5 => /lib/x86_64-linux-gnu/libzmq.so.5 (0x00007f3a)\n\t/lib64/ld-linux-x86-64.so.2 (0x00007f3b)\n")
	if err != nil || !slices.Equal(libs, []string{"/lib/x86_64-linux-gnu/libzmq.so.5", "/lib64/ld-linux-x86-64.so.2"}) {
		t.Fatalf("%v %v", libs, err)
	}
	if _, err := parseLdd("\tlibzmq.so.5 => not found\n"); err == nil {
		t.Fatal("a missing library was accepted")
	}
}
