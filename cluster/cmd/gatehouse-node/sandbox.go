package main

// The container side: `gatehouse-node exec-container` runs inside `ip netns exec POD-NETNS`
// (the Pod's network namespace and a private mount namespace of its own) and turns itself
// into the container process. For an OCI image it is also the first process of a new PID,
// UTS and IPC namespace (the agent starts it with those clone flags), and it:
//
//  1. mounts an overlay: the unpacked image (shared, never written) below, a per-container
//     upper directory above, so every container starts from the image as it was built;
//  2. mounts /proc (this PID namespace only), a minimal /dev on tmpfs (null, zero, full,
//     random, urandom, tty, shm, the fd links), /sys read-only, the Pod's /etc/hosts,
//     /etc/hostname and /etc/resolv.conf, and the Pod's volumes at their mountPaths, every
//     target resolved inside the root filesystem (symbolic links cannot point out of it);
//  3. pivot_root into the overlay and detaches the host's tree; remounts it read-only
//     when securityContext.readOnlyRootFilesystem is true;
//  4. sets the hostname, drops every capability the container does not keep from the
//     bounding set, clears the ambient set, sets no_new_privs if asked, switches to the
//     user, group and supplementary groups, and execs the command (looked up in the
//     image's PATH). A non-root user ends with no capabilities at all; root keeps exactly
//     the container's set.
//
// Without an image (an --image mapping) it only binds the volumes over host paths and execs
// the mapped binary, as root, as it always did for the conformance backends.
//
// `exec-container --join PID` runs a command in a running container instead (exec preStop
// hooks and exec probes): the agent starts it under `nsenter --target PID --net --pid --uts
// --ipc`, and it chroots to /proc/PID/root, which is the container's own mount tree.

import (
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

type mountFlags []string

func (m *mountFlags) String() string     { return strings.Join(*m, ",") }
func (m *mountFlags) Set(v string) error { *m = append(*m, v); return nil }

// sandbox is what exec-container was asked to set up.
type sandbox struct {
	mounts             mountFlags // SOURCE=TARGET[:ro]
	workdir            string
	rootfs, dir        string // image root filesystem and this container's directory
	join               int    // run in the running container with this host pid
	readonly           bool
	hostname           string
	uid, gid           int
	groups             string // comma-separated
	caps               uint64
	noNewPrivs, isRoot bool
	identity           bool // switch user and capabilities (image containers)
}

func execContainer(args []string) {
	fs := flag.NewFlagSet("exec-container", flag.ExitOnError)
	var sb sandbox
	fs.Var(&sb.mounts, "mount", "SOURCE=TARGET[:ro]")
	fs.StringVar(&sb.workdir, "workdir", "/", "working directory")
	fs.StringVar(&sb.rootfs, "rootfs", "", "unpacked image (overlay lower directory)")
	fs.StringVar(&sb.dir, "container-dir", "", "this container's directory (upper, work, root)")
	fs.IntVar(&sb.join, "join", 0, "host pid of a running container to run the command in")
	fs.BoolVar(&sb.readonly, "readonly", false, "read-only root filesystem")
	fs.StringVar(&sb.hostname, "hostname", "", "hostname (UTS namespace)")
	fs.BoolVar(&sb.identity, "identity", false, "apply --uid, --gid, --groups, --caps and --no-new-privs")
	fs.IntVar(&sb.uid, "uid", 0, "user id")
	fs.IntVar(&sb.gid, "gid", 0, "group id")
	fs.StringVar(&sb.groups, "groups", "", "supplementary group ids, comma-separated")
	caps := fs.String("caps", "0", "capability set kept (bit mask)")
	fs.BoolVar(&sb.noNewPrivs, "no-new-privs", false, "set no_new_privs (allowPrivilegeEscalation: false)")
	_ = fs.Parse(args)
	argv := fs.Args()
	if len(argv) == 0 {
		log.Fatal("exec-container: no command")
	}
	var err error
	if sb.caps, err = strconv.ParseUint(*caps, 0, 64); err != nil {
		log.Fatalf("exec-container: --caps: %v", err)
	}
	// Capabilities, no_new_privs and the bounding set are per thread: everything below runs
	// on this one, which is also the thread that calls execve.
	runtime.LockOSThread()
	switch {
	case sb.join != 0:
		err = sb.enter()
	case sb.rootfs != "":
		err = sb.setupRoot()
	default:
		err = sb.bindOnHost()
	}
	if err == nil && sb.identity {
		err = sb.dropPrivileges()
	}
	if err == nil {
		if err = os.Chdir(sb.workdir); err != nil {
			err = fmt.Errorf("working directory %s: %w", sb.workdir, err)
		}
	}
	var path string
	if err == nil {
		path, err = lookPath(argv[0], os.Getenv("PATH"))
	}
	if err == nil {
		err = syscall.Exec(path, argv, os.Environ())
	}
	// The container's log is this process's output: say why it did not start.
	fmt.Fprintf(os.Stderr, "gatehouse-node: cannot start container: %v\n", err)
	os.Exit(128)
}

// bindOnHost is the --image mapping case: the Pod's volumes bound over host paths (the
// mount points are created on the host if missing), nothing else.
func (sb *sandbox) bindOnHost() error {
	for _, m := range sb.mounts {
		src, target, ro := parseMount(m)
		if err := bind(src, target, ro); err != nil {
			return err
		}
	}
	return nil
}

func parseMount(m string) (src, target string, ro bool) {
	src, target, _ = strings.Cut(m, "=")
	ro = strings.HasSuffix(target, ":ro")
	return src, strings.TrimSuffix(target, ":ro"), ro
}

// bind mounts src (file or directory) on target, creating an empty target if missing.
func bind(src, target string, ro bool) error {
	if st, err := os.Stat(src); err == nil && !st.IsDir() {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		if f, err := os.OpenFile(target, os.O_CREATE, 0o644); err == nil {
			_ = f.Close()
		}
	} else if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", target, err)
	}
	if err := unix.Mount(src, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", src, target, err)
	}
	if ro {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", target, err)
		}
	}
	return nil
}

func (sb *sandbox) setupRoot() error {
	// Nothing mounted from here on may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	root := filepath.Join(sb.dir, "root")
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", sb.rootfs, filepath.Join(sb.dir, "upper"), filepath.Join(sb.dir, "work"))
	if err := unix.Mount("overlay", root, "overlay", 0, opts); err != nil {
		return fmt.Errorf("overlay on %s: %w", root, err)
	}
	dir := func(p string, mode uint32) (string, error) {
		d, err := inRoot(root, p)
		if err == nil {
			err = os.MkdirAll(d, os.FileMode(mode))
		}
		return d, err
	}
	proc, err := dir("/proc", 0o555)
	if err != nil {
		return err
	}
	if err := unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	sys, err := dir("/sys", 0o555)
	if err != nil {
		return err
	}
	if err := unix.Mount("sysfs", sys, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /sys: %w", err)
	}
	dev, err := dir("/dev", 0o755)
	if err != nil {
		return err
	}
	if err := mountDev(dev); err != nil {
		return err
	}
	for _, m := range sb.mounts {
		src, target, ro := parseMount(m)
		t, err := inRoot(root, target)
		if err != nil {
			return err
		}
		if err := bind(src, t, ro); err != nil {
			return err
		}
	}
	if _, err := dir(sb.workdir, 0o755); err != nil {
		return fmt.Errorf("working directory %s: %w", sb.workdir, err)
	}
	// pivot_root with the new root as both arguments stacks the old root on top of it;
	// detaching that leaves the container's tree alone (pivot_root(2)).
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if sb.readonly {
		if err := unix.Mount("", "/", "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only root: %w", err)
		}
	}
	if sb.hostname != "" {
		if err := unix.Sethostname([]byte(sb.hostname)); err != nil {
			return fmt.Errorf("hostname: %w", err)
		}
	}
	return nil
}

// mountDev puts a small /dev on tmpfs: the usual character devices and links, /dev/shm.
func mountDev(dev string) error {
	if err := unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev: %w", err)
	}
	for name, n := range map[string][2]uint32{"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8}, "urandom": {1, 9}, "tty": {5, 0}} {
		p := filepath.Join(dev, name)
		if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(n[0], n[1]))); err != nil {
			return fmt.Errorf("mknod %s: %w", p, err)
		}
		if err := unix.Chmod(p, 0o666); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "core": "/proc/kcore"} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.Mkdir(shm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=65536k"); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	return nil
}

// enter runs in the namespaces of a running container (nsenter did net, pid, uts, ipc):
// its root is the container's mount tree.
func (sb *sandbox) enter() error {
	if err := unix.Chroot(fmt.Sprintf("/proc/%d/root", sb.join)); err != nil {
		return fmt.Errorf("enter container %d: %w", sb.join, err)
	}
	return unix.Chdir("/")
}

// dropPrivileges leaves the process with the container's user and capabilities: the bounding
// set is cut to the kept set (so no file capability or setuid binary can exceed it), the
// ambient set is cleared, and setuid to a non-root user clears the permitted and effective
// sets (the kernel does, without SECBIT_KEEP_CAPS); root keeps exactly the kept set.
func (sb *sandbox) dropPrivileges() error {
	last := 40
	if b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			last = n
		}
	}
	for c := 0; c <= last; c++ {
		if sb.caps&(1<<c) == 0 {
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("drop capability %d: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clear ambient capabilities: %w", err)
	}
	if sb.noNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	var groups []int
	for _, g := range strings.Split(sb.groups, ",") {
		if g == "" {
			continue
		}
		n, err := strconv.Atoi(g)
		if err != nil {
			return fmt.Errorf("group %q: %w", g, err)
		}
		groups = append(groups, n)
	}
	// syscall's Setgroups/Setgid/Setuid change every thread of the process.
	if err := syscall.Setgroups(groups); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setgid(sb.gid); err != nil {
		return fmt.Errorf("setgid %d: %w", sb.gid, err)
	}
	if err := syscall.Setuid(sb.uid); err != nil {
		return fmt.Errorf("setuid %d: %w", sb.uid, err)
	}
	keep := sb.caps
	if sb.uid != 0 {
		keep = 0
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(keep), Permitted: uint32(keep)},
		{Effective: uint32(keep >> 32), Permitted: uint32(keep >> 32)},
	}
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	return nil
}

// lookPath finds a command the way execvp does, in the container's PATH and root.
func lookPath(name, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	if path == "" {
		path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%q: executable file not found in $PATH", name)
}

// setSysctls writes NAME=VALUE pairs under /proc/sys. It runs under `ip netns exec`, so the
// net.* ones land in the Pod's network namespace.
func setSysctls(args []string) {
	for _, a := range args {
		name, value, ok := strings.Cut(a, "=")
		if !ok {
			log.Fatalf("sysctl: want NAME=VALUE, got %q", a)
		}
		p := name
		if !strings.Contains(p, "/") {
			p = strings.ReplaceAll(p, ".", "/")
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", filepath.Clean("/"+p)), []byte(value), 0o644); err != nil {
			log.Fatalf("sysctl %s: %v", name, err)
		}
	}
}

// Capability numbers (linux/capability.h), by the names Kubernetes uses.
var capabilities = map[string]uint{
	"CHOWN": 0, "DAC_OVERRIDE": 1, "DAC_READ_SEARCH": 2, "FOWNER": 3, "FSETID": 4, "KILL": 5,
	"SETGID": 6, "SETUID": 7, "SETPCAP": 8, "LINUX_IMMUTABLE": 9, "NET_BIND_SERVICE": 10,
	"NET_BROADCAST": 11, "NET_ADMIN": 12, "NET_RAW": 13, "IPC_LOCK": 14, "IPC_OWNER": 15,
	"SYS_MODULE": 16, "SYS_RAWIO": 17, "SYS_CHROOT": 18, "SYS_PTRACE": 19, "SYS_PACCT": 20,
	"SYS_ADMIN": 21, "SYS_BOOT": 22, "SYS_NICE": 23, "SYS_RESOURCE": 24, "SYS_TIME": 25,
	"SYS_TTY_CONFIG": 26, "MKNOD": 27, "LEASE": 28, "AUDIT_WRITE": 29, "AUDIT_CONTROL": 30,
	"SETFCAP": 31, "MAC_OVERRIDE": 32, "MAC_ADMIN": 33, "SYSLOG": 34, "WAKE_ALARM": 35,
	"BLOCK_SUSPEND": 36, "AUDIT_READ": 37, "PERFMON": 38, "BPF": 39, "CHECKPOINT_RESTORE": 40,
}

// defaultCapabilities is the set containerd and Docker give a container that asks for none.
var defaultCapabilities = []string{"CHOWN", "DAC_OVERRIDE", "FSETID", "FOWNER", "MKNOD", "NET_RAW",
	"SETGID", "SETUID", "SETFCAP", "SETPCAP", "NET_BIND_SERVICE", "SYS_CHROOT", "KILL", "AUDIT_WRITE"}

const allCapabilities = ^uint64(0)

func capabilityBit(name string) (uint64, error) {
	n, ok := capabilities[strings.TrimPrefix(strings.ToUpper(name), "CAP_")]
	if !ok {
		return 0, fmt.Errorf("unknown capability %q", name)
	}
	return 1 << n, nil
}
