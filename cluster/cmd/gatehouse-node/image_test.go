package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid              int
}

func layer(t *testing.T, gz bool, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	var tw *tar.Writer
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	} else {
		tw = tar.NewWriter(&buf)
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.uid, Size: int64(len(e.body))}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			_, _ = tw.Write([]byte(e.body))
		}
	}
	_ = tw.Close()
	if zw != nil {
		_ = zw.Close()
	}
	return buf.Bytes()
}

// writeBlob stores data in an OCI layout and returns its descriptor.
func writeBlob(t *testing.T, dir, mediaType string, data []byte) ocispec.Descriptor {
	t.Helper()
	d := digest.FromBytes(data)
	p := filepath.Join(dir, "blobs", "sha256", d.Encoded())
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

func TestStoreResolvesAndUnpacks(t *testing.T) {
	store := t.TempDir()
	l1 := layer(t, true,
		entry{name: "a/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "a/x", typ: tar.TypeReg, body: "x"},
		entry{name: "a/y", typ: tar.TypeReg, body: "y"},
		entry{name: "b/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "b/old", typ: tar.TypeReg, body: "old"},
		entry{name: "b/sub/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "b/sub/deep", typ: tar.TypeReg, body: "deep"},
		entry{name: "abs", typ: tar.TypeSymlink, link: "/a"},
		entry{name: "up", typ: tar.TypeSymlink, link: "../../../.."},
		entry{name: "suid", typ: tar.TypeReg, body: "s", mode: 0o4755, uid: 1000},
	)
	l2 := layer(t, false,
		entry{name: "a/.wh.x", typ: tar.TypeReg},
		entry{name: "b/new", typ: tar.TypeReg, body: "new"},
		entry{name: "b/.wh..wh..opq", typ: tar.TypeReg},
		entry{name: "abs/through-link", typ: tar.TypeReg, body: "inside"},
		entry{name: "up/escaped", typ: tar.TypeReg, body: "inside too"},
		entry{name: "hard", typ: tar.TypeLink, link: "a/y"},
	)
	cfg, _ := json.Marshal(ocispec.Image{Config: ocispec.ImageConfig{Entrypoint: []string{"/bin/app"}, User: "65532"}})
	manifest := ocispec.Manifest{
		Config: writeBlob(t, store, ocispec.MediaTypeImageConfig, cfg),
		Layers: []ocispec.Descriptor{writeBlob(t, store, ocispec.MediaTypeImageLayerGzip, l1), writeBlob(t, store, ocispec.MediaTypeImageLayer, l2)},
	}
	manifest.SchemaVersion = 2
	mb, _ := json.Marshal(manifest)
	md := writeBlob(t, store, ocispec.MediaTypeImageManifest, mb)
	md.Annotations = map[string]string{ocispec.AnnotationRefName: "example/app"}
	index := ocispec.Index{Manifests: []ocispec.Descriptor{md}}
	index.SchemaVersion = 2
	ib, _ := json.Marshal(index)
	if err := os.WriteFile(filepath.Join(store, "index.json"), ib, 0o644); err != nil {
		t.Fatal(err)
	}

	s := &imageStore{dir: store, cache: t.TempDir()}
	for _, ref := range []string{"example/app", "example/app:latest", "docker.io/library/example/app:latest", "example/app@" + md.Digest.String()} {
		if _, err := s.resolve(ref); err != nil {
			t.Errorf("resolve %s: %v", ref, err)
		}
	}
	if _, err := s.resolve("example/app:2"); err == nil {
		t.Errorf("example/app:2 resolved")
	}
	img, err := s.resolve("example/app")
	if err != nil {
		t.Fatal(err)
	}
	if img.config.User != "65532" || img.config.Entrypoint[0] != "/bin/app" || img.id != "example/app@"+md.Digest.String() {
		t.Errorf("image %+v", img)
	}
	root := img.rootfs
	exists := func(p string) bool { _, err := os.Lstat(filepath.Join(root, p)); return err == nil }
	for p, want := range map[string]bool{
		"a/x": false, "a/y": true, // whiteout
		"b/old": false, "b/sub": false, "b/new": true, // opaque directory: lower content gone, this layer's kept
		"a/through-link": true, "escaped": true, "hard": true,
	} {
		if exists(p) != want {
			t.Errorf("%s exists: %v, want %v", p, !want, want)
		}
	}
	st, err := os.Stat(filepath.Join(root, "suid"))
	if err != nil || st.Mode()&os.ModeSetuid == 0 {
		t.Fatalf("suid lost its setuid bit: %v", err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; os.Geteuid() == 0 && uid != 1000 {
		t.Errorf("suid owner %d, want 1000", uid)
	}
}

func TestInRoot(t *testing.T) {
	root := t.TempDir()
	_ = os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755)
	_ = os.Symlink("/usr/lib", filepath.Join(root, "lib"))
	_ = os.Symlink("../../../../etc", filepath.Join(root, "usr/escape"))
	for in, want := range map[string]string{
		"/lib/x":         "usr/lib/x",
		"lib/../x":       "usr/x", // .. after a link is the link target's parent, as in the kernel
		"/usr/escape/pw": "etc/pw",
		"/missing/../y":  "y",
		"/":              "",
	} {
		got, err := inRoot(root, in)
		if err != nil || got != filepath.Join(root, want) {
			t.Errorf("inRoot(%q) = %q, %v; want %q", in, got, err, filepath.Join(root, want))
		}
	}
}
