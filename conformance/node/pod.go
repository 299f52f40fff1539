package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

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

	mu         sync.Mutex
	addr       net.IP
	netns      string
	started    metav1.Time
	containers []*containerState
	failure    string // a pod-level reason it cannot run (set once, visible in status)
	pending    string // why its containers cannot start yet (a volume's source is missing)
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
	for i := range pod.Spec.Containers {
		rt.containers = append(rt.containers, &containerState{spec: &pod.Spec.Containers[i], pod: rt})
	}
	return rt
}

func (rt *podRuntime) key() string { return rt.pod.Namespace + "/" + rt.pod.Name }

func (rt *podRuntime) logf(format string, args ...any) {
	log.Printf("pod %s: %s", rt.key(), fmt.Sprintf(format, args...))
}

// changed asks the status loop to write the Pod's status.
func (rt *podRuntime) changed() {
	select {
	case rt.dirty <- struct{}{}:
	default:
	}
}

func (rt *podRuntime) run(parent context.Context) {
	rt.ctx, rt.cancel = context.WithCancel(parent)
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
			rt.changed()
		}
		select {
		case <-rt.ctx.Done():
			return
		case <-time.After(time.Second):
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
	go rt.probeLoop()
	wg.Wait()
}

// setup gives the Pod an address and network namespace and writes its volumes.
func (rt *podRuntime) setup() error {
	if len(rt.pod.Spec.InitContainers) > 0 {
		return fmt.Errorf("init containers are not supported by gatehouse-node")
	}
	if rt.pod.Spec.HostNetwork {
		return fmt.Errorf("hostNetwork pods are not supported by gatehouse-node")
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
	return nil
}

// terminate stops the containers (SIGTERM, SIGKILL after grace) and frees the Pod's
// network and files.
func (rt *podRuntime) terminate(grace time.Duration) {
	if grace > 10*time.Second {
		grace = 10 * time.Second // tests, not production: nothing here needs long drains
	}
	for _, c := range rt.containers {
		c.signal(grace)
	}
	if rt.cancel != nil {
		rt.cancel()
	}
	<-rt.done
	rt.mu.Lock()
	addr := rt.addr
	rt.mu.Unlock()
	if addr != nil {
		rt.agent.network.detach(string(rt.uid))
		rt.agent.network.release(addr)
	}
	_ = os.RemoveAll(rt.dir)
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

func (rt *podRuntime) probeLoop() {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		for _, c := range rt.containers {
			if c.probe(rt.ctx) {
				rt.changed()
			}
		}
		select {
		case <-rt.ctx.Done():
			return
		case <-t.C:
		}
	}
}
