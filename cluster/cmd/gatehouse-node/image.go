package main

// Images from a local OCI image layout (--image-store DIR), as `buildah push IMAGE
// oci:DIR:REF` or `skopeo copy ... oci:DIR:REF` write it: DIR/index.json lists manifests
// whose org.opencontainers.image.ref.name annotation is REF, and every blob is in
// DIR/blobs/<algorithm>/<hex>. An image is unpacked once per manifest digest into
// <state-dir>/images/<hex>/rootfs and shared read-only by every container of it (each
// container writes to its own overlay upper directory, see sandbox.go).
//
// Why no container runtime library (containerd, containers/image, umoci, go-containerregistry):
// the node needs to read one local directory format and untar a few layers. Those libraries
// bring registries, signatures, storage drivers and hundreds of packages into a test binary
// that should stay small enough to read in full; resolving a ref name, checking digests and
// applying whiteouts is a page of standard-library code. Only the image-spec types are used.

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"
)

// image is what a container runs: a binary mapped with --image, or an unpacked OCI image.
type image struct {
	ref    string
	id     string // for the container status' imageID
	binary string // --image mapping: run this host binary, no root filesystem
	rootfs string // OCI image: the unpacked layers
	config ocispec.ImageConfig
}

type imageStore struct {
	dir   string // the OCI layout
	cache string // where images are unpacked

	mu       sync.Mutex
	unpacked map[digest.Digest]*image
}

// Docker's media types, which skopeo and buildah may keep when copying from a registry.
const (
	dockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"
	dockerManifest     = "application/vnd.docker.distribution.manifest.v2+json"
)

// normalizeRef makes "docker.io/library/name" and "name" the same, and gives a ref
// without a tag or digest the tag "latest".
func normalizeRef(r string) string {
	r = strings.TrimPrefix(r, "docker.io/library/")
	if strings.Contains(r, "@") {
		return r
	}
	if !strings.Contains(r[strings.LastIndex(r, "/")+1:], ":") {
		r += ":latest"
	}
	return r
}

// resolve finds the image named ref in the layout and unpacks it if it was not yet.
// index.json is read on every call, so images pushed while the node runs are found.
func (s *imageStore) resolve(ref string) (*image, error) {
	var index ocispec.Index
	if err := readJSON(filepath.Join(s.dir, "index.json"), "", &index); err != nil {
		return nil, fmt.Errorf("image store %s: %w", s.dir, err)
	}
	want := normalizeRef(ref)
	var found *ocispec.Descriptor
	for i, d := range index.Manifests {
		name := d.Annotations[ocispec.AnnotationRefName]
		_, dgst, byDigest := strings.Cut(want, "@")
		if name == ref || (name != "" && normalizeRef(name) == want) || (byDigest && d.Digest.String() == dgst) {
			found = &index.Manifests[i]
		}
	}
	if found == nil {
		return nil, fmt.Errorf("image %q is not in the image store %s (no manifest with ref name %q or %q)", ref, s.dir, ref, want)
	}
	desc := *found
	// An image index (several platforms): take this machine's.
	for desc.MediaType == ocispec.MediaTypeImageIndex || desc.MediaType == dockerManifestList {
		var sub ocispec.Index
		if err := readJSON(s.blob(desc.Digest), desc.Digest, &sub); err != nil {
			return nil, err
		}
		var next *ocispec.Descriptor
		for i, m := range sub.Manifests {
			if m.Platform == nil || (m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH) {
				next = &sub.Manifests[i]
				break
			}
		}
		if next == nil {
			return nil, fmt.Errorf("image %q has no linux/%s manifest", ref, runtime.GOARCH)
		}
		desc = *next
	}
	if desc.MediaType != "" && desc.MediaType != ocispec.MediaTypeImageManifest && desc.MediaType != dockerManifest {
		return nil, fmt.Errorf("image %q: unsupported manifest media type %s", ref, desc.MediaType)
	}

	// The image ID in container statuses: the repository and the manifest digest.
	repo, _, _ := strings.Cut(want, "@")
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	id := repo + "@" + desc.Digest.String()

	s.mu.Lock()
	defer s.mu.Unlock()
	if img := s.unpacked[desc.Digest]; img != nil {
		return &image{ref: ref, id: id, rootfs: img.rootfs, config: img.config}, nil
	}
	var manifest ocispec.Manifest
	if err := readJSON(s.blob(desc.Digest), desc.Digest, &manifest); err != nil {
		return nil, err
	}
	var config ocispec.Image
	if err := readJSON(s.blob(manifest.Config.Digest), manifest.Config.Digest, &config); err != nil {
		return nil, err
	}
	if config.Architecture != "" && config.Architecture != runtime.GOARCH {
		return nil, fmt.Errorf("image %q is for %s/%s, this node is linux/%s", ref, config.OS, config.Architecture, runtime.GOARCH)
	}
	dir := filepath.Join(s.cache, desc.Digest.Encoded())
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		tmp := dir + ".tmp"
		_ = os.RemoveAll(dir)
		_ = os.RemoveAll(tmp)
		if err := os.MkdirAll(filepath.Join(tmp, "rootfs"), 0o755); err != nil {
			return nil, err
		}
		for _, l := range manifest.Layers {
			if err := applyLayer(filepath.Join(tmp, "rootfs"), s.blob(l.Digest), l.Digest); err != nil {
				_ = os.RemoveAll(tmp)
				return nil, fmt.Errorf("image %q: layer %s: %w", ref, l.Digest, err)
			}
		}
		if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, dir); err != nil {
			return nil, err
		}
	}
	if s.unpacked == nil {
		s.unpacked = map[digest.Digest]*image{}
	}
	s.unpacked[desc.Digest] = &image{rootfs: filepath.Join(dir, "rootfs"), config: config.Config}
	return &image{ref: ref, id: id, rootfs: filepath.Join(dir, "rootfs"), config: config.Config}, nil
}

func (s *imageStore) blob(d digest.Digest) string {
	return filepath.Join(s.dir, "blobs", d.Algorithm().String(), d.Encoded())
}

// readJSON decodes a file, checking its digest when one is given.
func readJSON(file string, d digest.Digest, v any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if d != "" {
		if err := d.Validate(); err != nil {
			return err
		}
		if d.Algorithm().FromBytes(data) != d {
			return fmt.Errorf("blob %s does not match its digest", file)
		}
	}
	return json.Unmarshal(data, v)
}

// applyLayer extracts one layer (tar, tar+gzip) over root, applying OCI whiteouts:
// ".wh.NAME" deletes NAME of the lower layers, ".wh..wh..opq" empties its directory of
// lower-layer content. Owners, modes (setuid/setgid/sticky included), extended attributes
// (file capabilities among them) and modification times are kept. The blob's digest is
// checked as it is read.
func applyLayer(root, blob string, want digest.Digest) error {
	if err := want.Validate(); err != nil {
		return err
	}
	f, err := os.Open(blob)
	if err != nil {
		return err
	}
	defer f.Close()
	verifier := want.Verifier()
	br := bufio.NewReader(io.TeeReader(f, verifier))
	magic, _ := br.Peek(4)
	var r io.Reader = br
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		r = gz
	case len(magic) == 4 && string(magic) == "\x28\xb5\x2f\xfd":
		return errors.New("zstd-compressed layers are not supported by gatehouse-node (push the image with gzip or uncompressed layers)")
	}
	a := &layerApplier{root: root, created: map[string]bool{}}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := a.apply(hdr, tr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	// The rest of the stream (tar padding, gzip trailer) still counts for the digest.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return err
	}
	if !verifier.Verified() {
		return fmt.Errorf("blob does not match its digest")
	}
	return nil
}

type layerApplier struct {
	root    string
	created map[string]bool // host paths this layer wrote: whiteouts never remove them
}

func (a *layerApplier) apply(hdr *tar.Header, r io.Reader) error {
	name := path.Clean("/" + hdr.Name)
	if name == "/" {
		return nil
	}
	dir, base := path.Split(name)
	parent, err := inRoot(a.root, dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	if base == ".wh..wh..opq" {
		return a.removeLower(parent)
	}
	if hidden, ok := strings.CutPrefix(base, ".wh."); ok {
		if target := filepath.Join(parent, hidden); !a.created[target] {
			return os.RemoveAll(target)
		}
		return nil
	}
	target := filepath.Join(parent, base)
	if fi, err := os.Lstat(target); err == nil && !(fi.IsDir() && hdr.Typeflag == tar.TypeDir) {
		if err := os.RemoveAll(target); err != nil {
			return err
		}
	}
	mode := uint32(hdr.Mode & 0o7777)
	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil && !os.IsExist(err) {
			return err
		}
	case tar.TypeReg, '\x00':
		out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(out, r)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		ldir, lbase := path.Split(path.Clean("/" + hdr.Linkname))
		lparent, err := inRoot(a.root, ldir)
		if err != nil {
			return err
		}
		a.created[target] = true
		return os.Link(filepath.Join(lparent, lbase), target)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		kind := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[hdr.Typeflag]
		if err := unix.Mknod(target, kind|mode, int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))); err != nil {
			return err
		}
	default:
		return nil // global headers and the like carry no file
	}
	a.created[target] = true
	// chown clears setuid bits and file capabilities, so it goes first.
	if err := unix.Lchown(target, hdr.Uid, hdr.Gid); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeSymlink {
		if err := unix.Chmod(target, mode); err != nil {
			return err
		}
	}
	for k, v := range hdr.PAXRecords {
		if attr, ok := strings.CutPrefix(k, "SCHILY.xattr."); ok {
			// Best effort: some namespaces (user.* on symlinks) cannot be set.
			_ = unix.Lsetxattr(target, attr, []byte(v), 0)
		}
	}
	if hdr.Typeflag != tar.TypeDir {
		ts := []unix.Timespec{unix.NsecToTimespec(hdr.AccessTime.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
		if hdr.AccessTime.IsZero() {
			ts[0] = ts[1]
		}
		_ = unix.UtimesNanoAt(unix.AT_FDCWD, target, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// removeLower deletes everything in dir that this layer did not write (an opaque whiteout).
func (a *layerApplier) removeLower(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case !a.created[p]:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := a.removeLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// inRoot resolves p inside root the way a process chrooted to root would see it: every
// symbolic link, absolute or relative, is followed without ever leaving root. Components
// that do not exist are kept as written. The result is a host path under root.
func inRoot(root, p string) (string, error) {
	todo := strings.Split(p, "/")
	var done []string // resolved components below root
	links := 0
	missing := false
	for len(todo) > 0 {
		part := todo[0]
		todo = todo[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			continue
		}
		next := filepath.Join(append([]string{root}, append(done, part)...)...)
		if !missing {
			fi, err := os.Lstat(next)
			switch {
			case errors.Is(err, os.ErrNotExist):
				missing = true
			case err != nil:
				return "", err
			case fi.Mode()&os.ModeSymlink != 0:
				if links++; links > 40 {
					return "", fmt.Errorf("%s: too many levels of symbolic links", p)
				}
				target, err := os.Readlink(next)
				if err != nil {
					return "", err
				}
				if strings.HasPrefix(target, "/") {
					done = nil
				}
				todo = append(strings.Split(target, "/"), todo...)
				continue
			}
		}
		done = append(done, part)
	}
	return filepath.Join(append([]string{root}, done...)...), nil
}
