package main

import (
	"context"
	"fmt"
	"log"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// agent reconciles Pods: bind unscheduled ones to this node, start the ones bound here,
// stop and finalise the deleted ones. Each running Pod is owned by one podRuntime.
type agent struct {
	client  kubernetes.Interface
	cfg     config
	network *podNetwork
	self    string
	store   *imageStore // nil without --image-store

	pods  listersv1.PodLister
	queue workqueue.TypedRateLimitingInterface[string]

	// Services and EndpointSlices (Service environment variables, the ClusterIP rules of
	// proxy, the answers of dns), and the host's resolv.conf (dnsPolicy Default).
	view    *serviceView
	proxy   *serviceProxy
	dns     *dnsServer
	hostDNS resolvConf

	mu      sync.Mutex
	running map[string]*podRuntime // by namespace/name
}

func newAgent(client kubernetes.Interface, cfg config, network *podNetwork, self string) *agent {
	a := &agent{
		client:  client,
		cfg:     cfg,
		network: network,
		self:    self,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		running: map[string]*podRuntime{},
	}
	if cfg.imageStore != "" {
		a.store = &imageStore{dir: cfg.imageStore, cache: filepath.Join(cfg.stateDir, "images")}
	}
	return a
}

// resolveImage finds what runs a container image: an --image mapping first, then the
// image store.
func (a *agent) resolveImage(ref string) (*image, error) {
	if bin, ok := a.cfg.images[ref]; ok {
		return &image{ref: ref, id: "gatehouse-node://" + bin, binary: bin}, nil
	}
	if a.store == nil {
		return nil, fmt.Errorf("gatehouse-node cannot run image %q: no build of it is configured (--image) and there is no --image-store", ref)
	}
	return a.store.resolve(ref)
}

func (a *agent) registerNode(ctx context.Context, port int) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: a.cfg.nodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": a.cfg.nodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     "amd64",
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: a.network.cidr.String(), PodCIDRs: []string{a.network.cidr.String()}},
	}
	_, err := a.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return a.updateNodeStatus(ctx, port)
}

func (a *agent) updateNodeStatus(ctx context.Context, port int) error {
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.nodeName, metav1.GetOptions{})
	if err != nil {
		return err
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, old := range node.Status.Conditions {
			if old.Type == t && old.Status == s {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("2"),
		corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods:   resource.MustParse("250"),
	}
	node.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "gatehouse-node is posting ready status"),
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", ""),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", ""),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", ""),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: a.network.gateway.String()},
			{Type: corev1.NodeHostName, Address: a.cfg.nodeName},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(port)}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          "v1.34.4",
			ContainerRuntimeVersion: "gatehouse-node://0.1",
			OperatingSystem:         "linux",
			Architecture:            "amd64",
		},
	}
	_, err = a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

func (a *agent) heartbeat(ctx context.Context, port int) {
	t := time.NewTicker(15 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.updateNodeStatus(ctx, port); err != nil && ctx.Err() == nil {
				log.Printf("node heartbeat: %v", err)
			}
		}
	}
}

func (a *agent) run(ctx context.Context) {
	factory := informers.NewSharedInformerFactory(a.client, 0)
	inf := factory.Core().V1().Pods()
	a.pods = inf.Lister()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			a.queue.Add(key)
		}
	}
	_, _ = inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	// Services and EndpointSlices: every change re-renders the ClusterIP rules; the DNS
	// answers and environment variables read the caches when asked.
	services, slices := factory.Core().V1().Services(), factory.Discovery().V1().EndpointSlices()
	a.view = &serviceView{services: services.Lister(), slices: slices.Lister()}
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.proxy.kick() },
		UpdateFunc: func(any, any) { a.proxy.kick() },
		DeleteFunc: func(any) { a.proxy.kick() },
	}
	_, _ = services.Informer().AddEventHandler(kick)
	_, _ = slices.Informer().AddEventHandler(kick)
	a.proxy.view = a.view
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	// Before any Pod starts: the Service rules in place (a failure is logged and retried by
	// proxy.run, which starts with a sync) and the DNS server answering.
	_ = a.proxy.sync()
	go a.proxy.run(ctx)
	a.dns.serve(a.view)
	go func() {
		<-ctx.Done()
		a.queue.ShutDown()
	}()
	for {
		key, quit := a.queue.Get()
		if quit {
			return
		}
		if err := a.reconcile(ctx, key); err != nil && ctx.Err() == nil {
			log.Printf("pod %s: %v (retrying)", key, err)
			a.queue.AddRateLimited(key)
		} else {
			a.queue.Forget(key)
		}
		a.queue.Done(key)
	}
}

func (a *agent) reconcile(ctx context.Context, key string) error {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	pod, err := a.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		// Gone from the API (force-deleted): stop whatever still runs under that name
		// (in the background: a graceful stop of it may be in progress).
		go a.stop(key, "", 0, false)
		return nil
	}
	if err != nil {
		return err
	}
	if rt := a.lookup(key); rt != nil && rt.uid != pod.UID {
		a.stop(key, rt.uid, 0, false) // same name, new Pod: the old one is gone
	}
	switch {
	case pod.Spec.NodeName == "":
		if pod.DeletionTimestamp != nil || (pod.Spec.SchedulerName != "" && pod.Spec.SchedulerName != corev1.DefaultSchedulerName) {
			return nil
		}
		return a.bind(ctx, pod)
	case pod.Spec.NodeName != a.cfg.nodeName:
		return nil
	case pod.DeletionTimestamp != nil:
		// The grace period the deletion asked for (kubectl delete --grace-period), else the
		// Pod's terminationGracePeriodSeconds. Only the first update of a deleted Pod starts
		// its finalisation; our own status writes while it terminates come back here.
		grace := 30 * time.Second
		switch {
		case pod.DeletionGracePeriodSeconds != nil:
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		case pod.Spec.TerminationGracePeriodSeconds != nil:
			grace = time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
		}
		a.mu.Lock()
		rt := a.running[key]
		if rt != nil && rt.uid == pod.UID {
			if rt.terminating {
				a.mu.Unlock()
				return nil
			}
			rt.terminating = true
		}
		a.mu.Unlock()
		go a.finalise(ctx, key, pod.UID, grace)
		return nil
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.running[key]; ok {
		return nil
	}
	rt := newPodRuntime(a, pod.DeepCopy())
	a.running[key] = rt
	go rt.run()
	return nil
}

func (a *agent) bind(ctx context.Context, pod *corev1.Pod) error {
	err := a.client.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: a.cfg.nodeName},
	}, metav1.CreateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil // already bound, or deleted meanwhile
	}
	return err
}

func (a *agent) lookup(key string) *podRuntime {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.running[key]
}

// stop terminates a Pod's processes (preStop hooks if asked, SIGTERM, SIGKILL after grace)
// and removes its network and files. uid "" matches any. The Pod stays known (its logs
// readable) until it is gone.
func (a *agent) stop(key string, uid types.UID, grace time.Duration, hooks bool) {
	a.mu.Lock()
	rt := a.running[key]
	a.mu.Unlock()
	if rt == nil || (uid != "" && rt.uid != uid) {
		return
	}
	rt.terminate(grace, hooks)
	a.mu.Lock()
	if a.running[key] == rt {
		delete(a.running, key)
	}
	a.mu.Unlock()
}

// finalise is the kubelet's half of Pod deletion: once the containers are stopped, the
// Pod object is deleted with grace 0 (the API server waits for this).
func (a *agent) finalise(ctx context.Context, key string, uid types.UID, grace time.Duration) {
	a.stop(key, uid, grace, true)
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	zero := int64(0)
	err := a.client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
		log.Printf("pod %s: final delete: %v", key, err)
	}
}

// stopAll is the agent's exit: every container gets SIGTERM and, 5 s later, SIGKILL (no
// preStop hooks: the node is going, not the Pods).
func (a *agent) stopAll(ctx context.Context) {
	a.mu.Lock()
	all := a.running
	a.running = map[string]*podRuntime{}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, rt := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rt.terminate(5*time.Second, false)
		}()
	}
	wg.Wait()
	_ = a.client.CoreV1().Nodes().Delete(ctx, a.cfg.nodeName, metav1.DeleteOptions{})
}

// runtimeFor finds a running Pod for the kubelet API.
func (a *agent) runtimeFor(ns, name string) *podRuntime {
	return a.lookup(ns + "/" + name)
}
