package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	binary := flag.String("binary", "../../bin/rolter", "the built rolter binary")
	version := flag.String("version", "dev", "the image's version: its tag and label")
	layoutDir := flag.String("layout", "../../bin/image", "where to write the OCI image layout")
	tarPath := flag.String("tar", "../../bin/rolter-image.tar", "where to write the docker-archive tarball")
	flag.Parse()
	if err := run(*binary, *version, *layoutDir, *tarPath); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(binary, version, layoutDir, tarPath string) error {
	img, err := Build(binary, version)
	if err != nil {
		return err
	}
	tag, err := name.NewTag("rolter:" + version)
	if err != nil {
		return err
	}
	if err := writeLayout(img, layoutDir, tag); err != nil {
		return err
	}
	if err := tarball.WriteToFile(tarPath, tag, img); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	size, _ := img.Size()
	layers, _ := img.Layers()
	var layerSize int64
	for _, l := range layers {
		s, _ := l.Size()
		layerSize += s
	}
	fmt.Printf("image %s %s (manifest %d bytes, layer %d bytes)\n  OCI layout  %s\n  docker tar  %s\n",
		tag, digest, size, layerSize, absolute(layoutDir), absolute(tarPath))
	return nil
}

// writeLayout writes img as the only image of a fresh OCI layout at dir, annotated with its tag.
func writeLayout(img v1.Image, dir string, tag name.Tag) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": tag.TagStr(),
		"io.containerd.image.name":          tag.String(),
	}))
}

// absolute is p made absolute, for messages.
func absolute(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}
