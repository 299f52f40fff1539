package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// containerState is one container of a Pod: a process, restarted per the Pod's
// restartPolicy with exponential back-off, with its output appended to a log file as
// "<RFC3339Nano> <stream> <line>".
type containerState struct {
	spec *corev1.Container
	pod  *podRuntime
	dir  string // overlay upper/work/root of an image container

	mu        sync.Mutex
	img       *image
	cmd       *exec.Cmd
	run       *runSpec      // how the current process was started (exec hooks reuse it)
	exited    chan struct{} // closed when the current process has exited
	startedAt metav1.Time
	running   bool
	started   bool // the startup probe passed (or there is none)
	ready     bool
	restarts  int32
	waiting   *corev1.ContainerStateWaiting
	lastExit  *corev1.ContainerStateTerminated
	final     *corev1.ContainerStateTerminated // exited and the restart policy says done
	stopping  bool                             // the Pod is going: never start again
	logMu     sync.Mutex
	logFile   *os.File
}

// runSpec is one start of a container, computed from the Pod, the image and the API objects
// it refers to.
type runSpec struct {
	argv, env, mounts    []string
	workdir              string
	uid, gid             int64
	groups               []int64
	caps                 uint64
	readonly, noNewPrivs bool
}

var errStopping = errors.New("the pod is stopping")

func (c *containerState) logPath() string {
	return filepath.Join(c.pod.dir, "logs", c.spec.Name+".log")
}

func (c *containerState) setWaiting(reason, msg string) {
	c.mu.Lock()
	c.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: msg}
	c.mu.Unlock()
	c.pod.changed()
}

func (c *containerState) isStopping() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopping
}

// supervise runs the container until ctx ends, restarting it as the restart policy says.
func (c *containerState) supervise(ctx context.Context) {
	if !c.pullImage(ctx) {
		return
	}
	f, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.setWaiting("CreateContainerError", err.Error())
		return
	}
	c.logFile = f
	defer f.Close()

	cfg := c.pod.agent.cfg
	backoff := cfg.backoffInitial
	for ctx.Err() == nil && !c.isStopping() {
		spec, err := c.prepare(ctx)
		if err != nil {
			// Like the kubelet: retried (a ConfigMap may appear), never counted as a restart.
			c.setWaiting("CreateContainerConfigError", err.Error())
			if !sleep(ctx, time.Second) {
				return
			}
			continue
		}
		began := time.Now()
		exit, err := c.runOnce(ctx, spec)
		if errors.Is(err, errStopping) || ctx.Err() != nil || c.isStopping() {
			return
		}
		if err != nil {
			c.setWaiting("RunContainerError", err.Error())
		}
		policy := c.pod.pod.Spec.RestartPolicy
		if policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && exit == 0 && err == nil) {
			c.mu.Lock()
			c.final = c.lastExit
			c.mu.Unlock()
			c.pod.changed()
			return
		}
		if time.Since(began) >= 2*cfg.backoffMax {
			backoff = cfg.backoffInitial // it ran long enough: start over, as the kubelet does
		}
		p := c.pod.pod
		msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", backoff, c.spec.Name, p.Name, p.Namespace, p.UID)
		c.mu.Lock()
		if c.waiting == nil {
			c.waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: msg}
		}
		c.mu.Unlock()
		c.pod.changed()
		c.pod.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container "+c.spec.Name)
		if !sleep(ctx, backoff) {
			return
		}
		c.mu.Lock()
		c.restarts++
		c.mu.Unlock()
		backoff = min(2*backoff, cfg.backoffMax)
	}
}

// pullImage resolves the container's image, retrying every 5 s while it cannot be found
// (the container stays Waiting with ErrImagePull, the Pod never Ready).
func (c *containerState) pullImage(ctx context.Context) bool {
	for attempt := 0; ; attempt++ {
		img, err := c.pod.agent.resolveImage(c.spec.Image)
		if err == nil {
			c.mu.Lock()
			c.img = img
			c.mu.Unlock()
			return true
		}
		c.setWaiting("ErrImagePull", err.Error())
		if attempt == 0 {
			c.pod.logf("container %s: %v", c.spec.Name, err)
			c.pod.event(corev1.EventTypeWarning, "Failed", fmt.Sprintf("Failed to pull image %q: %v", c.spec.Image, err))
		}
		if !sleep(ctx, 5*time.Second) {
			return false
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// prepare computes how to start the container now: environment, command, user,
// capabilities and mounts.
func (c *containerState) prepare(ctx context.Context) (*runSpec, error) {
	rt, spec, img := c.pod, c.spec, c.img
	if img.binary != "" {
		if len(spec.Command) > 0 {
			return nil, fmt.Errorf("image %s is mapped to a binary (--image), which runs as it is; a container command override needs the image in --image-store", spec.Image)
		}
		env, err := rt.containerEnv(ctx, spec, append([]string{"PATH=" + defaultPath, "HOSTNAME=" + rt.hostname()}, rt.serviceEnv()...))
		if err != nil {
			return nil, err
		}
		mounts, err := rt.mounts(spec)
		if err != nil {
			return nil, err
		}
		workdir := spec.WorkingDir
		if workdir == "" {
			workdir = "/"
		}
		return &runSpec{argv: append([]string{img.binary}, expandAll(spec.Args, env)...), env: env, mounts: mounts, workdir: workdir}, nil
	}

	// An image: its Env, then the Service variables, then the Pod's; Kubernetes command/args
	// replace the image's Entrypoint/Cmd (command alone drops Cmd).
	s := &runSpec{workdir: spec.WorkingDir}
	var err error
	if s.uid, s.gid, s.groups, err = rt.identity(spec, img); err != nil {
		return nil, err
	}
	base := []string{"PATH=" + defaultPath, "HOME=" + homeDir(img.rootfs, s.uid)}
	base = append(base, img.config.Env...)
	base = append(base, "HOSTNAME="+rt.hostname())
	base = append(base, rt.serviceEnv()...)
	env, err := rt.containerEnv(ctx, spec, base)
	if err != nil {
		return nil, err
	}
	var argv []string
	switch {
	case len(spec.Command) > 0:
		argv = append(expandAll(spec.Command, env), expandAll(spec.Args, env)...)
	case len(spec.Args) > 0:
		argv = append(append(argv, img.config.Entrypoint...), expandAll(spec.Args, env)...)
	default:
		argv = append(append(argv, img.config.Entrypoint...), img.config.Cmd...)
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("no command: the image has no Entrypoint or Cmd and the container sets no command")
	}
	s.argv, s.env = argv, env
	if s.workdir == "" {
		s.workdir = img.config.WorkingDir
	}
	if s.workdir == "" {
		s.workdir = "/"
	}
	if s.caps, err = containerCapabilities(spec.SecurityContext); err != nil {
		return nil, err
	}
	if sc := spec.SecurityContext; sc != nil {
		s.readonly = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		s.noNewPrivs = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	}
	// /etc/hosts, /etc/hostname and /etc/resolv.conf as the kubelet provides them, unless a
	// volume is mounted there.
	taken := map[string]bool{}
	for _, m := range spec.VolumeMounts {
		taken[filepath.Clean(m.MountPath)] = true
	}
	for _, f := range []string{"hosts", "hostname", "resolv.conf"} {
		if !taken["/etc/"+f] {
			s.mounts = append(s.mounts, filepath.Join(rt.dir, "etc", f)+"=/etc/"+f)
		}
	}
	volumes, err := rt.mounts(spec)
	if err != nil {
		return nil, err
	}
	s.mounts = append(s.mounts, volumes...)
	return s, nil
}

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// containerCapabilities is the capability set of a container, as containerd computes it:
// the default set, or all when privileged; "ALL" in add gives all, "ALL" in drop none;
// then the named additions and drops.
func containerCapabilities(sc *corev1.SecurityContext) (uint64, error) {
	if sc != nil && sc.Privileged != nil && *sc.Privileged {
		return allCapabilities, nil
	}
	var set uint64
	for _, n := range defaultCapabilities {
		b, _ := capabilityBit(n)
		set |= b
	}
	if sc == nil || sc.Capabilities == nil {
		return set, nil
	}
	isAll := func(c corev1.Capability) bool { return strings.EqualFold(string(c), "ALL") }
	for _, c := range sc.Capabilities.Add {
		if isAll(c) {
			set = allCapabilities
		}
	}
	for _, c := range sc.Capabilities.Drop {
		if isAll(c) {
			set = 0
		}
	}
	for _, c := range sc.Capabilities.Add {
		if !isAll(c) {
			b, err := capabilityBit(string(c))
			if err != nil {
				return 0, err
			}
			set |= b
		}
	}
	for _, c := range sc.Capabilities.Drop {
		if !isAll(c) {
			b, err := capabilityBit(string(c))
			if err != nil {
				return 0, err
			}
			set &^= b
		}
	}
	return set, nil
}

// command is the process that becomes the container: exec-container inside the Pod's
// network namespace; for an image also in new PID, UTS and IPC namespaces.
func (c *containerState) command(s *runSpec) *exec.Cmd {
	rt := c.pod
	args := []string{"netns", "exec", rt.netns, rt.agent.self, "exec-container", "--workdir", s.workdir}
	for _, m := range s.mounts {
		args = append(args, "--mount", m)
	}
	attr := &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if c.img.rootfs != "" {
		args = append(args, "--rootfs", c.img.rootfs, "--container-dir", c.dir, "--hostname", rt.hostname())
		if s.readonly {
			args = append(args, "--readonly")
		}
		args = append(args, identityArgs(s)...)
		attr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC
	}
	args = append(append(args, "--"), s.argv...)
	cmd := exec.Command("ip", args...)
	cmd.Env = s.env
	cmd.SysProcAttr = attr
	return cmd
}

func identityArgs(s *runSpec) []string {
	groups := make([]string, len(s.groups))
	for i, g := range s.groups {
		groups[i] = strconv.FormatInt(g, 10)
	}
	args := []string{"--identity", "--uid", strconv.FormatInt(s.uid, 10), "--gid", strconv.FormatInt(s.gid, 10),
		"--groups", strings.Join(groups, ","), "--caps", fmt.Sprintf("%#x", s.caps)}
	if s.noNewPrivs {
		args = append(args, "--no-new-privs")
	}
	return args
}

// runOnce starts the process, probes it while it runs and waits for it to exit.
func (c *containerState) runOnce(ctx context.Context, s *runSpec) (int, error) {
	if c.img.rootfs != "" {
		// A fresh writable layer on every start, as a new container would have.
		_ = os.RemoveAll(c.dir)
		for _, d := range []string{"upper", "work", "root"} {
			if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
				return -1, err
			}
		}
	}
	cmd := c.command(s)
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return 0, errStopping
	}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		return -1, err
	}
	exited := make(chan struct{})
	c.cmd, c.run, c.exited, c.running, c.ready, c.waiting, c.startedAt = cmd, s, exited, true, false, nil, metav1.Now()
	c.started = c.spec.StartupProbe == nil
	c.mu.Unlock()
	c.pod.changed()

	runCtx, cancel := context.WithCancel(ctx)
	go c.probe(runCtx, time.Now())
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); c.copyLog(stdout, "stdout") }()
	go func() { defer copies.Done(); c.copyLog(stderr, "stderr") }()
	copies.Wait()
	err := cmd.Wait()
	cancel()

	code := exitCode(cmd.ProcessState)
	c.mu.Lock()
	c.running, c.ready, c.started, c.cmd = false, false, false, nil
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.lastExit = &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, StartedAt: c.startedAt,
		FinishedAt: metav1.Now(), ContainerID: fmt.Sprintf("gatehouse-node://%d", cmd.Process.Pid)}
	stopping := c.stopping
	close(exited)
	c.mu.Unlock()
	c.pod.changed()
	if !stopping {
		c.pod.logf("container %s exited with code %d", c.spec.Name, code)
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		err = nil
	}
	return code, err
}

// exitCode is the exit status, or 128+signal for a process killed by a signal (137 for
// SIGKILL), as container runtimes report it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

func (c *containerState) copyLog(r io.Reader, stream string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := time.Now().UTC().Format(time.RFC3339Nano) + " " + stream + " " + sc.Text() + "\n"
		c.logMu.Lock()
		_, _ = c.logFile.WriteString(line)
		c.logMu.Unlock()
	}
}

// stop ends the current process the way the kubelet kills a container: the preStop hook
// (when hooks is set), then SIGTERM, then SIGKILL at the deadline, which counts from the
// start of the hook. A hook that used the whole grace period gets 2 s more for SIGTERM.
// final means the Pod is going: the container is never started again.
func (c *containerState) stop(deadline time.Time, hooks, final bool, why string) {
	c.mu.Lock()
	if final {
		c.stopping = true
	}
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return
	}
	c.pod.event(corev1.EventTypeNormal, "Killing", fmt.Sprintf("Stopping container %s%s", c.spec.Name, why))
	if h := c.spec.Lifecycle; hooks && h != nil && h.PreStop != nil {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		c.runHook(ctx, h.PreStop, exited)
		cancel()
		if !time.Now().Before(deadline) {
			deadline = time.Now().Add(2 * time.Second)
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-exited:
		return
	case <-t.C:
	}
	c.pod.logf("container %s: still running at the end of its grace period; SIGKILL", c.spec.Name)
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-exited
}

// runHook runs a lifecycle handler until it ends, ctx ends or the container exits.
func (c *containerState) runHook(ctx context.Context, h *corev1.LifecycleHandler, exited <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	var err error
	kind := "sleep"
	switch {
	case h.Sleep != nil:
		sleep(ctx, time.Duration(h.Sleep.Seconds)*time.Second)
	case h.HTTPGet != nil:
		kind = "httpGet"
		if ok, msg := c.httpGet(ctx, h.HTTPGet); !ok {
			err = errors.New(msg)
		}
	case h.Exec != nil:
		kind = "exec"
		var out []byte
		var code int
		if code, out, err = c.execIn(ctx, h.Exec.Command); err == nil && code != 0 {
			err = fmt.Errorf("command %q exited with %d: %s", h.Exec.Command, code, strings.TrimSpace(string(out)))
		}
	default:
		err = errors.New("this preStop handler (tcpSocket) is not supported, as in the kubelet")
	}
	c.pod.logf("container %s: preStop %s hook ran for %s", c.spec.Name, kind, time.Since(start).Round(time.Millisecond))
	if err != nil && ctx.Err() == nil {
		c.pod.logf("container %s: preStop hook failed: %v", c.spec.Name, err)
		c.pod.event(corev1.EventTypeWarning, "FailedPreStopHook", fmt.Sprintf("PreStopHook failed: %v", err))
	}
}

// execIn runs a command in the running container (exec hooks and probes): the same
// namespaces, root filesystem, environment, working directory, user and capabilities.
func (c *containerState) execIn(ctx context.Context, argv []string) (int, []byte, error) {
	c.mu.Lock()
	cmd, s := c.cmd, c.run
	c.mu.Unlock()
	if cmd == nil || s == nil {
		return -1, nil, errors.New("the container is not running")
	}
	if len(argv) == 0 {
		return -1, nil, errors.New("no command")
	}
	pid := strconv.Itoa(cmd.Process.Pid)
	args := []string{"--target", pid, "--net", "--pid", "--uts", "--ipc", "--",
		c.pod.agent.self, "exec-container", "--join", pid, "--workdir", s.workdir}
	if c.img.rootfs != "" {
		args = append(args, identityArgs(s)...)
	}
	args = append(append(args, "--"), argv...)
	x := exec.CommandContext(ctx, "nsenter", args...)
	x.Env = s.env
	x.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	x.Cancel = func() error { return syscall.Kill(-x.Process.Pid, syscall.SIGKILL) }
	x.WaitDelay = time.Second
	out, err := x.CombinedOutput()
	if x.ProcessState != nil && ctx.Err() == nil {
		return x.ProcessState.ExitCode(), out, nil
	}
	if err == nil {
		err = ctx.Err()
	}
	return -1, out, err
}

func (c *containerState) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running && c.ready
}

func (c *containerState) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := corev1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.spec.Image,
		Ready:        c.running && c.ready,
		RestartCount: c.restarts,
	}
	if c.img != nil {
		s.ImageID = c.img.id
	}
	started := c.running && c.started
	s.Started = &started
	switch {
	case c.running:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
		if c.cmd != nil && c.cmd.Process != nil {
			s.ContainerID = fmt.Sprintf("gatehouse-node://%d", c.cmd.Process.Pid)
		}
	case c.final != nil:
		s.State.Terminated = c.final.DeepCopy()
		s.ContainerID = c.final.ContainerID
	case c.waiting != nil:
		s.State.Waiting = c.waiting.DeepCopy()
	default:
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	if c.lastExit != nil && c.final == nil {
		s.LastTerminationState.Terminated = c.lastExit.DeepCopy()
	}
	return s
}
