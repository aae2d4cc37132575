// Command image assembles Rolter's container image from a built `rolter` binary, without a registry, a
// base image or a container engine: one layer holding the binary, every shared library its loader
// resolves (`ldd`) and the loader itself at the paths the binary asks for, a passwd and group with the
// non-root user rolter (65532), the CA bundle, and the directories the gateway writes; an OCI image
// config naming that user, the entrypoint and the ports. It writes an OCI image layout (for skopeo,
// crane, containerd) and a docker-archive tarball (for `podman load`, `docker load`, `kind load
// image-archive`). The layer is deterministic: sorted entries, fixed times and owners, so the same binary
// and libraries give the same digest.
//
// It is a module of its own (deploy/image/go.mod) so that go-containerregistry never becomes a dependency
// of the gateway.
package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's user, paths and ports; the Helm chart and the Dockerfile use the same.
const (
	uid        = 65532
	binaryPath = "/usr/local/bin/rolter"
	configDir  = "/etc/rolter"
	dataDir    = "/var/lib/rolter"
	caBundle   = "/etc/ssl/certs/ca-certificates.crt"
)

// epoch is the time of every entry and of the image: a fixed time keeps the digest reproducible.
var epoch = time.Unix(0, 0).UTC()

// entry is one file of the layer.
type entry struct {
	name string // absolute path in the image
	mode int64
	uid  int
	dir  bool
	data []byte
}

// sharedLibraries returns the shared objects binary loads, as `ldd` resolves them: the path the loader
// finds each at (the first is the loader itself when listed) - what the image must hold at those paths.
func sharedLibraries(binary string) ([]string, error) {
	out, err := exec.Command("ldd", binary).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "not a dynamic executable") {
			return nil, nil
		}
		return nil, fmt.Errorf("ldd %s: %v: %s", binary, err, out)
	}
	return parseLdd(string(out))
}

var (
	lddArrow = regexp.MustCompile(`^\s*\S+ => (/\S+) \(0x[0-9a-f]+\)$`)
	lddPlain = regexp.MustCompile(`^\s*(/\S+) \(0x[0-9a-f]+\)$`)
)

// parseLdd reads ldd's lines: "libzmq.so.5 => /lib/x86_64-linux-gnu/libzmq.so.5 (0x...)" for a library,
// "/lib64/ld-linux-x86-64.so.2 (0x...)" for the loader, "linux-vdso.so.1 (0x...)" for the kernel's (no file).
func parseLdd(out string) ([]string, error) {
	var libs []string
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "" || strings.Contains(line, "linux-vdso") {
			continue
		}
		if strings.Contains(line, "not found") {
			return nil, fmt.Errorf("ldd: a library is missing: %s", strings.TrimSpace(line))
		}
		if m := lddArrow.FindStringSubmatch(line); m != nil {
			libs = append(libs, m[1])
		} else if m := lddPlain.FindStringSubmatch(line); m != nil {
			libs = append(libs, m[1])
		} else {
			return nil, fmt.Errorf("ldd: cannot read %q", line)
		}
	}
	return libs, nil
}

// files lists the layer: the binary, its libraries (each the content of the file its path resolves to,
// kept at the path the loader looks at), the accounts, the CA bundle and the directories.
func files(binary string) ([]entry, error) {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return nil, err
	}
	es := []entry{
		{name: binaryPath, mode: 0o755, data: bin},
		{name: "/etc/passwd", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nrolter:x:%d:%d:rolter:%s:/sbin/nologin\n", uid, uid, dataDir)},
		{name: "/etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nrolter:x:%d:\n", uid)},
		// Go's own resolver reads hosts, then DNS.
		{name: "/etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: configDir, mode: 0o755, dir: true},
		{name: dataDir, mode: 0o750, dir: true, uid: uid},
		{name: "/tmp", mode: 0o1777, dir: true},
	}
	if ca, err := os.ReadFile(caBundle); err == nil {
		es = append(es, entry{name: caBundle, mode: 0o644, data: ca})
	}
	libs, err := sharedLibraries(binary)
	if err != nil {
		return nil, err
	}
	for _, lib := range libs {
		data, err := os.ReadFile(lib) // follows the symlinks: the file the loader would map
		if err != nil {
			return nil, err
		}
		es = append(es, entry{name: lib, mode: 0o755, data: data})
	}
	return withParents(es), nil
}

// withParents adds the directories the entries sit in and sorts everything by path.
func withParents(es []entry) []entry {
	have := map[string]bool{}
	for _, e := range es {
		have[e.name] = true
	}
	for _, e := range es {
		for d := path.Dir(e.name); d != "/" && !have[d]; d = path.Dir(d) {
			have[d] = true
			es = append(es, entry{name: d, mode: 0o755, dir: true})
		}
	}
	sort.Slice(es, func(i, j int) bool { return es[i].name < es[j].name })
	return es
}

// layerTar is the layer as an uncompressed tar.
func layerTar(es []entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		h := &tar.Header{Name: strings.TrimPrefix(e.name, "/"), Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Build assembles the image of binary, labelled with version.
func Build(binary, version string) (v1.Image, error) {
	es, err := files(binary)
	if err != nil {
		return nil, err
	}
	raw, err := layerTar(es)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: epoch}
	cf.Config = v1.Config{
		User:         fmt.Sprintf("%d:%d", uid, uid),
		Entrypoint:   []string{binaryPath},
		Cmd:          []string{"serve", "-config", configDir + "/rolter.toml"},
		Env:          []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		WorkingDir:   dataDir,
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "8081/tcp": {}},
		Volumes:      map[string]struct{}{dataDir: {}},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "rolter",
			"org.opencontainers.image.description": "Rolter, a cache-aware OpenAI-compatible gateway for vLLM fleets",
			"org.opencontainers.image.version":     version,
			"org.opencontainers.image.source":      "https://github.com/rolter-ai/rolter",
		},
	}
	return mutate.ConfigFile(img, cf)
}
