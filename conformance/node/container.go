package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// containerState is one container of a Pod: a process, restarted per the Pod's
// restartPolicy, with its output appended to a log file as "<RFC3339Nano> <stream> <line>".
type containerState struct {
	spec *corev1.Container
	pod  *podRuntime

	mu           sync.Mutex
	cmd          *exec.Cmd
	startedAt    metav1.Time
	running      bool
	ready        bool
	restarts     int32
	waiting      *corev1.ContainerStateWaiting
	lastExit     *corev1.ContainerStateTerminated
	stopping     bool
	binary       string
	logMu        sync.Mutex
	logFile      *os.File
	probeFailure int
}

func (c *containerState) logPath() string {
	return filepath.Join(c.pod.dir, "logs", c.spec.Name+".log")
}

func (c *containerState) setWaiting(reason, msg string) {
	c.mu.Lock()
	c.waiting = &corev1.ContainerStateWaiting{Reason: reason, Message: msg}
	c.mu.Unlock()
	c.pod.changed()
}

// supervise runs the container until ctx ends, restarting it as the restart policy says.
func (c *containerState) supervise(ctx context.Context) {
	binary, ok := c.pod.agent.cfg.images[c.spec.Image]
	if !ok {
		c.setWaiting("ErrImagePull", fmt.Sprintf("gatehouse-node cannot run image %q: no build of it is configured (--image)", c.spec.Image))
		c.pod.logf("container %s: no build for image %s; the pod stays Pending", c.spec.Name, c.spec.Image)
		return
	}
	if len(c.spec.Command) > 0 {
		c.setWaiting("CreateContainerConfigError", "gatehouse-node runs the image's own entrypoint; container command overrides are not supported")
		return
	}
	c.binary = binary
	f, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.setWaiting("CreateContainerError", err.Error())
		return
	}
	c.logFile = f
	defer f.Close()

	backoff := time.Second
	for ctx.Err() == nil {
		env, err := c.pod.containerEnv(ctx, c.spec)
		if err != nil {
			c.setWaiting("CreateContainerConfigError", err.Error())
			if !sleep(ctx, backoff) {
				return
			}
			continue
		}
		exit, err := c.runOnce(ctx, env)
		if err != nil {
			c.setWaiting("RunContainerError", err.Error())
		}
		policy := c.pod.pod.Spec.RestartPolicy
		if ctx.Err() != nil || policy == corev1.RestartPolicyNever || (policy == corev1.RestartPolicyOnFailure && exit == 0 && err == nil) {
			return
		}
		c.mu.Lock()
		c.restarts++
		if c.waiting == nil {
			c.waiting = &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: fmt.Sprintf("back-off %s restarting failed container", backoff)}
		}
		c.mu.Unlock()
		c.pod.changed()
		if !sleep(ctx, backoff) {
			return
		}
		backoff = min(2*backoff, 20*time.Second)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// runOnce starts the process in the Pod's network namespace and waits for it to exit.
func (c *containerState) runOnce(ctx context.Context, env []string) (int, error) {
	args := []string{"netns", "exec", c.pod.netns, c.pod.agent.self, "exec-container"}
	mounts, err := c.pod.mounts(c.spec)
	if err != nil {
		return -1, err
	}
	for _, m := range mounts {
		args = append(args, "--mount", m)
	}
	workdir := c.spec.WorkingDir
	if workdir == "" {
		workdir = "/"
	}
	args = append(args, "--workdir", workdir, "--", c.binary)
	args = append(args, expandAll(c.spec.Args, env)...)
	cmd := exec.Command("ip", args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return -1, err
	}
	var copies sync.WaitGroup
	copies.Add(2)
	go func() { defer copies.Done(); c.copyLog(stdout, "stdout") }()
	go func() { defer copies.Done(); c.copyLog(stderr, "stderr") }()

	c.mu.Lock()
	c.cmd, c.running, c.ready, c.waiting, c.startedAt, c.probeFailure = cmd, true, false, nil, metav1.Now(), 0
	c.mu.Unlock()
	c.pod.changed()

	copies.Wait()
	err = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	c.mu.Lock()
	c.running, c.ready, c.cmd = false, false, nil
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.lastExit = &corev1.ContainerStateTerminated{ExitCode: int32(code), Reason: reason, StartedAt: c.startedAt, FinishedAt: metav1.Now()}
	stopping := c.stopping
	c.mu.Unlock()
	c.pod.changed()
	if !stopping {
		c.pod.logf("container %s exited with code %d", c.spec.Name, code)
	}
	if _, ok := err.(*exec.ExitError); ok {
		err = nil
	}
	return code, err
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

// signal asks the process group to stop, and kills it after grace.
func (c *containerState) signal(grace time.Duration) {
	c.mu.Lock()
	c.stopping = true
	cmd := c.cmd
	c.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	pgid := -cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		alive := c.cmd != nil
		c.mu.Unlock()
		if !alive {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

func (c *containerState) isReady() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running && c.ready
}

// probe runs the readiness check once and reports whether readiness changed. Without a
// readinessProbe a container counts as ready once every TCP port it declares accepts
// connections — stricter than the kubelet (ready as soon as it runs), so a backend is
// never published before it listens.
func (c *containerState) probe(ctx context.Context) bool {
	c.mu.Lock()
	running, was := c.running, c.ready
	c.mu.Unlock()
	if !running {
		return false
	}
	rt := c.pod
	rt.mu.Lock()
	addr := rt.addr
	rt.mu.Unlock()
	ok := true
	if p := c.spec.ReadinessProbe; p != nil {
		ok = c.runProbe(ctx, p, addr)
	} else {
		for _, port := range c.spec.Ports {
			if port.Protocol == "" || port.Protocol == corev1.ProtocolTCP {
				ok = ok && dialOK(ctx, addr, int(port.ContainerPort))
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return false
	}
	if ok {
		c.probeFailure = 0
	} else {
		c.probeFailure++
	}
	threshold := 1
	if p := c.spec.ReadinessProbe; p != nil && p.FailureThreshold > 0 && was {
		threshold = int(p.FailureThreshold)
	}
	if ok {
		c.ready = true
	} else if c.probeFailure >= threshold {
		c.ready = false
	}
	return c.ready != was
}

func (c *containerState) portNumber(p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	n, _ := strconv.Atoi(p.StrVal)
	return n
}

func (c *containerState) runProbe(ctx context.Context, p *corev1.Probe, addr net.IP) bool {
	timeout := time.Duration(max(p.TimeoutSeconds, 1)) * time.Second
	switch {
	case p.HTTPGet != nil:
		scheme := "http"
		if p.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(addr.String(), strconv.Itoa(c.portNumber(p.HTTPGet.Port))), p.HTTPGet.Path)
		client := http.Client{Timeout: timeout, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		for _, h := range p.HTTPGet.HTTPHeaders {
			req.Header.Set(h.Name, h.Value)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode >= 200 && resp.StatusCode < 400
	case p.TCPSocket != nil:
		return dialOK(ctx, addr, c.portNumber(p.TCPSocket.Port))
	default:
		// exec and gRPC probes are not implemented: never claim readiness we did not check.
		return false
	}
}

func dialOK(ctx context.Context, addr net.IP, port int) bool {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(addr.String(), strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

func (c *containerState) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := corev1.ContainerStatus{
		Name:         c.spec.Name,
		Image:        c.spec.Image,
		ImageID:      "gatehouse-node://" + c.binary,
		Ready:        c.running && c.ready,
		RestartCount: c.restarts,
	}
	started := c.running
	s.Started = &started
	switch {
	case c.running:
		s.State.Running = &corev1.ContainerStateRunning{StartedAt: c.startedAt}
		if c.cmd != nil && c.cmd.Process != nil {
			s.ContainerID = fmt.Sprintf("gatehouse-node://%d", c.cmd.Process.Pid)
		}
	case c.waiting != nil:
		s.State.Waiting = c.waiting.DeepCopy()
	default:
		s.State.Waiting = &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}
	}
	if c.lastExit != nil {
		s.LastTerminationState.Terminated = c.lastExit.DeepCopy()
	}
	return s
}
