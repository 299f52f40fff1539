package main

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A Secret volume's files are root's with mode 0440; fsGroup makes them the group's and
// readable by it, directories searchable and setgid.
func TestApplyFSGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chown to another group needs root")
	}
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "sub", "tls.key")
	if err := os.WriteFile(file, []byte("k"), 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := applyFSGroup(dir, 65532); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]os.FileMode{
		file:                      0o440,
		filepath.Join(dir, "sub"): 0o750 | os.ModeSetgid | os.ModeDir,
	} {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode() & (os.ModePerm | os.ModeSetgid | os.ModeDir); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
		if gid := info.Sys().(*syscall.Stat_t).Gid; gid != 65532 {
			t.Errorf("%s: group %d, want 65532", p, gid)
		}
	}
}
