package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// podRuntime owns one Pod on this node: its network namespace, volume files, container
// processes and the status it reports.
type podRuntime struct {
	agent *agent
	pod   *corev1.Pod // as first seen; the spec of a Pod is immutable where it matters here
	uid   types.UID
	dir   string

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}

	stopOnce    sync.Once
	terminating bool // under agent.mu: finalisation started

	mu         sync.Mutex
	addr       net.IP
	netns      string
	started    metav1.Time
	containers []*containerState
	failure    string // a pod-level reason it cannot run (set once, visible in status)
	pending    string // why its containers cannot start yet (a volume's source is missing)
	tmpfs      []string
	dirty      chan struct{}
}

func newPodRuntime(a *agent, pod *corev1.Pod) *podRuntime {
	rt := &podRuntime{
		agent:   a,
		pod:     pod,
		uid:     pod.UID,
		dir:     filepath.Join(a.cfg.stateDir, "pods", string(pod.UID)),
		done:    make(chan struct{}),
		started: metav1.Now(),
		dirty:   make(chan struct{}, 1),
	}
	rt.ctx, rt.cancel = context.WithCancel(context.Background())
	for i := range pod.Spec.Containers {
		rt.containers = append(rt.containers, &containerState{
			spec: &pod.Spec.Containers[i],
			pod:  rt,
			dir:  filepath.Join(rt.dir, "containers", pod.Spec.Containers[i].Name),
		})
	}
	return rt
}

func (rt *podRuntime) key() string { return rt.pod.Namespace + "/" + rt.pod.Name }

func (rt *podRuntime) logf(format string, args ...any) {
	log.Printf("pod %s: %s", rt.key(), fmt.Sprintf(format, args...))
}

// event records a core/v1 Event on the Pod, as the kubelet does (kubectl describe shows it).
func (rt *podRuntime) event(kind, reason, msg string) {
	now := metav1.Now()
	p := rt.pod
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: p.Name + ".", Namespace: p.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Reason:         reason, Message: msg, Type: kind, Count: 1,
		FirstTimestamp: now, LastTimestamp: now,
		Source: corev1.EventSource{Component: "gatehouse-node", Host: rt.agent.cfg.nodeName},
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = rt.agent.client.CoreV1().Events(p.Namespace).Create(ctx, ev, metav1.CreateOptions{})
	}()
}

// changed asks the status loop to write the Pod's status.
func (rt *podRuntime) changed() {
	select {
	case rt.dirty <- struct{}{}:
	default:
	}
}

func (rt *podRuntime) ip() net.IP {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.addr
}

func (rt *podRuntime) hostname() string {
	h := rt.pod.Spec.Hostname
	if h == "" {
		h = rt.pod.Name
	}
	if len(h) > 63 {
		h = h[:63]
	}
	return h
}

// gracePeriod is the Pod's terminationGracePeriodSeconds (30 s when unset).
func (rt *podRuntime) gracePeriod() time.Duration {
	if g := rt.pod.Spec.TerminationGracePeriodSeconds; g != nil {
		return time.Duration(*g) * time.Second
	}
	return 30 * time.Second
}

func (rt *podRuntime) run() {
	defer close(rt.done)
	statusDone := make(chan struct{})
	go func() {
		defer close(statusDone)
		rt.statusLoop()
	}()
	defer func() { <-statusDone }()
	rt.changed()

	if err := rt.setup(); err != nil {
		rt.mu.Lock()
		rt.failure = err.Error()
		rt.mu.Unlock()
		rt.logf("cannot start: %v", err)
		rt.event(corev1.EventTypeWarning, "FailedCreatePodSandBox", err.Error())
		rt.changed()
		<-rt.ctx.Done()
		return
	}
	// Like the kubelet, keep trying to mount volumes whose Secret or ConfigMap does not exist
	// yet: the suite creates some certificates only after it applied the Deployments.
	for attempt := 0; ; attempt++ {
		err := rt.writeVolumes()
		rt.mu.Lock()
		rt.pending = ""
		if err != nil {
			rt.pending = err.Error()
		}
		rt.mu.Unlock()
		if err == nil {
			break
		}
		if attempt == 0 {
			rt.logf("waiting for volumes: %v", err)
			rt.event(corev1.EventTypeWarning, "FailedMount", err.Error())
			rt.changed()
		}
		if !sleep(rt.ctx, time.Second) {
			return
		}
	}
	rt.changed()
	var wg sync.WaitGroup
	for _, c := range rt.containers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.supervise(rt.ctx)
		}()
	}
	wg.Wait()
}

// setup gives the Pod an address and network namespace, applies its sysctls there and
// writes the /etc files image containers get.
func (rt *podRuntime) setup() error {
	if len(rt.pod.Spec.InitContainers) > 0 {
		return fmt.Errorf("init containers are not supported by gatehouse-node")
	}
	if sp := rt.pod.Spec; sp.HostNetwork || sp.HostPID || sp.HostIPC || (sp.ShareProcessNamespace != nil && *sp.ShareProcessNamespace) {
		return fmt.Errorf("hostNetwork, hostPID, hostIPC and shareProcessNamespace pods are not supported by gatehouse-node")
	}
	var sysctls []string
	if sc := rt.pod.Spec.SecurityContext; sc != nil {
		for _, s := range sc.Sysctls {
			if !strings.HasPrefix(s.Name, "net.") {
				return fmt.Errorf("SysctlForbidden: gatehouse-node only sets net.* sysctls (in the Pod's network namespace), not %s", s.Name)
			}
			sysctls = append(sysctls, s.Name+"="+s.Value)
		}
	}
	if err := os.MkdirAll(filepath.Join(rt.dir, "logs"), 0o755); err != nil {
		return err
	}
	addr, err := rt.agent.network.allocate()
	if err != nil {
		return err
	}
	netns, err := rt.agent.network.attach(string(rt.uid), addr)
	if err != nil {
		rt.agent.network.release(addr)
		return err
	}
	rt.mu.Lock()
	rt.addr, rt.netns = addr, netns
	rt.mu.Unlock()
	rt.changed()
	if len(sysctls) > 0 {
		args := append([]string{"netns", "exec", netns, rt.agent.self, "sysctl"}, sysctls...)
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("sysctls: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	return rt.writeEtc(addr)
}

// writeEtc writes the Pod's /etc/hosts, /etc/hostname and /etc/resolv.conf (for its
// dnsPolicy and dnsConfig: podResolvConf in dns.go).
func (rt *podRuntime) writeEtc(addr net.IP) error {
	dir := filepath.Join(rt.dir, "etc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var hosts strings.Builder
	hosts.WriteString("# Kubernetes-managed hosts file (gatehouse-node).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
	fmt.Fprintf(&hosts, "%s\t%s\n", addr, rt.hostname())
	for _, a := range rt.pod.Spec.HostAliases {
		fmt.Fprintf(&hosts, "%s\t%s\n", a.IP, strings.Join(a.Hostnames, "\t"))
	}
	a := rt.agent
	resolv := podResolvConf(rt.pod, a.hostDNS, a.network.gateway.String(), a.cfg.clusterDomain)
	for name, data := range map[string][]byte{"hosts": []byte(hosts.String()), "hostname": []byte(rt.hostname() + "\n"), "resolv.conf": []byte(resolv)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// terminate stops the containers (concurrently; each runs its preStop hook when hooks is
// set, then SIGTERM, then SIGKILL at the end of grace) and frees the Pod's network, mounts
// and files. Later calls wait for the first one.
func (rt *podRuntime) terminate(grace time.Duration, hooks bool) {
	rt.stopOnce.Do(func() {
		deadline := time.Now().Add(grace)
		var wg sync.WaitGroup
		for _, c := range rt.containers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.stop(deadline, hooks, true, "")
			}()
		}
		wg.Wait()
		rt.cancel()
		<-rt.done
		rt.mu.Lock()
		addr := rt.addr
		rt.mu.Unlock()
		if addr != nil {
			rt.agent.network.detach(string(rt.uid))
			rt.agent.network.release(addr)
		}
		for _, m := range rt.tmpfs {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				rt.logf("unmount %s: %v", m, err)
			}
		}
		_ = os.RemoveAll(rt.dir)
	})
}

// ready reports whether every container is running and ready.
func (rt *podRuntime) ready() bool {
	for _, c := range rt.containers {
		if !c.isReady() {
			return false
		}
	}
	return len(rt.containers) > 0
}

// identity is the user, group and supplementary groups of an image container: runAsUser
// and runAsGroup (container over Pod), else the image's User ("uid", "uid:gid", or names
// looked up in the image's /etc/passwd and /etc/group), else root; the group defaults to
// the user's primary group in the image, else 0. Supplementary groups: the Pod's
// supplementalGroups and fsGroup. runAsNonRoot is enforced as the kubelet does.
func (rt *podRuntime) identity(c *corev1.Container, img *image) (uid, gid int64, groups []int64, err error) {
	var runAsUser, runAsGroup *int64
	var nonRoot *bool
	if psc := rt.pod.Spec.SecurityContext; psc != nil {
		runAsUser, runAsGroup, nonRoot = psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
		groups = append(groups, psc.SupplementalGroups...)
		if psc.FSGroup != nil {
			groups = append(groups, *psc.FSGroup)
		}
	}
	if csc := c.SecurityContext; csc != nil {
		if csc.RunAsUser != nil {
			runAsUser = csc.RunAsUser
		}
		if csc.RunAsGroup != nil {
			runAsGroup = csc.RunAsGroup
		}
		if csc.RunAsNonRoot != nil {
			nonRoot = csc.RunAsNonRoot
		}
	}
	userName, groupName, _ := strings.Cut(img.config.User, ":")
	switch {
	case runAsUser != nil:
		uid = *runAsUser
	case userName == "":
	default:
		n, perr := strconv.ParseInt(userName, 10, 64)
		if perr != nil {
			if nonRoot != nil && *nonRoot {
				return 0, 0, nil, fmt.Errorf("container has runAsNonRoot and image has non-numeric user (%s), cannot verify user is non-root", userName)
			}
			if n, perr = lookupID(img.rootfs, "/etc/passwd", userName); perr != nil {
				return 0, 0, nil, fmt.Errorf("image user %q: %w", userName, perr)
			}
		}
		uid = n
	}
	if nonRoot != nil && *nonRoot && uid == 0 {
		return 0, 0, nil, fmt.Errorf("container has runAsNonRoot and image will run as root")
	}
	switch {
	case runAsGroup != nil:
		gid = *runAsGroup
	case groupName != "" && runAsUser == nil:
		n, perr := strconv.ParseInt(groupName, 10, 64)
		if perr != nil {
			if n, perr = lookupID(img.rootfs, "/etc/group", groupName); perr != nil {
				return 0, 0, nil, fmt.Errorf("image group %q: %w", groupName, perr)
			}
		}
		gid = n
	default:
		gid = primaryGroup(img.rootfs, uid)
	}
	return uid, gid, groups, nil
}

// lookupID finds a name's id (third field) in the image's passwd or group file.
func lookupID(rootfs, file, name string) (int64, error) {
	p, err := inRoot(rootfs, file)
	if err != nil {
		return 0, err
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Split(line, ":")
		if len(f) >= 3 && f[0] == name {
			return strconv.ParseInt(f[2], 10, 64)
		}
	}
	return 0, fmt.Errorf("not found in %s", file)
}

// passwdEntry is the line of uid in the image's /etc/passwd, split in its fields (nil if none).
func passwdEntry(rootfs string, uid int64) []string {
	p, err := inRoot(rootfs, "/etc/passwd")
	if err != nil {
		return nil
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 7 && f[2] == strconv.FormatInt(uid, 10) {
			return f
		}
	}
	return nil
}

// primaryGroup is the group of uid in the image's /etc/passwd, 0 if it has none.
func primaryGroup(rootfs string, uid int64) int64 {
	if f := passwdEntry(rootfs, uid); f != nil {
		if g, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			return g
		}
	}
	return 0
}

// homeDir is the home of uid in the image's /etc/passwd, "/" if it has none (as runc sets
// HOME when the image and the Pod do not).
func homeDir(rootfs string, uid int64) string {
	if f := passwdEntry(rootfs, uid); f != nil && f[5] != "" {
		return f[5]
	}
	return "/"
}
