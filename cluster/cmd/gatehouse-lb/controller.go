package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

const (
	// loadBalancerClass is the class gatehouse-lb serves, besides Services with no class.
	loadBalancerClass = "gatehouse.dev/local-lb"
	// conditionType is the Service status condition gatehouse-lb writes.
	conditionType = "gatehouse.dev/AddressAllocated"
	// Errors of status.loadBalancer.ingress[].ports[] (provider-specific errors must be
	// domain-prefixed CamelCase).
	portErrUnsupportedProtocol = "gatehouse.dev/UnsupportedProtocol"
	portErrListenFailed        = "gatehouse.dev/ListenFailed"
	portErrNotServing          = "gatehouse.dev/NotServing"
)

type controller struct {
	client      kubernetes.Interface
	factory     informers.SharedInformerFactory
	services    corelisters.ServiceLister
	slices      discoverylisters.EndpointSliceLister
	synced      []cache.InformerSynced
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
	alloc       *allocator
	lb          *haproxy
	udp         *udpProxy
	trigger     chan struct{}
	// reported remembers the last Event of each kind per Service, so that a state is
	// announced once, not on every sync.
	reported map[string]string
}

func newController(client kubernetes.Interface, alloc *allocator, lb *haproxy, resync time.Duration) *controller {
	factory := informers.NewSharedInformerFactory(client, resync)
	svcInf := factory.Core().V1().Services()
	sliceInf := factory.Discovery().V1().EndpointSlices()
	broadcaster := record.NewBroadcaster()
	c := &controller{
		client:      client,
		factory:     factory,
		services:    svcInf.Lister(),
		slices:      sliceInf.Lister(),
		synced:      []cache.InformerSynced{svcInf.Informer().HasSynced, sliceInf.Informer().HasSynced},
		broadcaster: broadcaster,
		recorder:    broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gatehouse-lb"}),
		alloc:       alloc,
		lb:          lb,
		udp:         newUDPProxy(),
		trigger:     make(chan struct{}, 1),
		reported:    map[string]string{},
	}
	kick := func(any) { c.kick() }
	_, _ = svcInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    kick,
		UpdateFunc: func(_, o any) { c.kick() },
		DeleteFunc: kick,
	})
	// EndpointSlices of Services gatehouse-lb does not serve change nothing here.
	sliceKick := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		s, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			c.kick()
			return
		}
		name := s.Labels[discoveryv1.LabelServiceName]
		if svc, err := c.services.Services(s.Namespace).Get(name); err == nil && handles(svc) {
			c.kick()
		}
	}
	_, _ = sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    sliceKick,
		UpdateFunc: func(_, o any) { sliceKick(o) },
		DeleteFunc: sliceKick,
	})
	return c
}

func (c *controller) kick() {
	select {
	case c.trigger <- struct{}{}:
	default:
	}
}

// handles says whether a Service is gatehouse-lb's: type LoadBalancer with no class or ours.
func handles(s *corev1.Service) bool {
	if s.Spec.Type != corev1.ServiceTypeLoadBalancer {
		return false
	}
	c := s.Spec.LoadBalancerClass
	return c == nil || *c == "" || *c == loadBalancerClass
}

func key(s *corev1.Service) string { return s.Namespace + "/" + s.Name }

// run syncs the whole state (level-triggered: every change recomputes everything, which is
// cheap at test-cluster scale) until ctx ends. ready is called once, after the informers
// synced and haproxy runs.
func (c *controller) run(ctx context.Context, ready func()) error {
	c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return errors.New("informers did not sync")
	}
	log.Printf("informers synced")
	backoff := time.Second
	announced := false
	for {
		var retry <-chan time.Time
		if err := c.sync(ctx); err != nil {
			log.Printf("sync: %v (retrying in %s)", err, backoff)
			retry = time.After(backoff)
			backoff = min(2*backoff, 30*time.Second)
		} else {
			backoff = time.Second
			if len(c.lb.listenErr) > 0 {
				retry = time.After(5 * time.Second) // the address may become free
			}
		}
		if !announced && c.lb.isRunning() {
			announced = true
			ready()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.trigger:
		case <-retry:
		case <-c.lb.exitedC():
			log.Printf("haproxy exited unexpectedly; starting it again")
		}
		// Let a burst of changes (an EndpointSlice rewritten field by field, several
		// Services created at once) arrive before computing.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(30 * time.Millisecond):
		}
		select {
		case <-c.trigger:
		default:
		}
	}
}

func (c *controller) shutdown() {
	c.udp.stop()
	c.broadcaster.Shutdown()
}

// outcome is the allocation state of one Service for this sync.
type outcome struct {
	ip      netip.Addr
	reason  string // condition reason
	message string
}

func (c *controller) sync(ctx context.Context) error {
	all, err := c.services.List(labels.Everything())
	if err != nil {
		return err
	}
	// Oldest first: when two Services claim one address, the older one keeps it.
	slices.SortFunc(all, func(a, b *corev1.Service) int {
		if d := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); d != 0 {
			return d
		}
		return strings.Compare(key(a), key(b))
	})
	byKey := map[string]*corev1.Service{}
	var ours []*corev1.Service
	for _, s := range all {
		byKey[key(s)] = s
		if handles(s) {
			ours = append(ours, s)
		}
	}

	// 1. Release the addresses of Services that are gone or no longer LoadBalancer (the API
	// server clears their status.loadBalancer itself when the type changes).
	for _, k := range c.alloc.keys() {
		if s, ok := byKey[k]; ok && handles(s) {
			continue
		}
		ip, _ := c.alloc.release(k)
		log.Printf("%s: released %s", k, ip)
		if s, ok := byKey[k]; ok {
			c.recorder.Eventf(s, corev1.EventTypeNormal, "AddressReleased", "Released %s: the Service is no longer of type LoadBalancer (or has another loadBalancerClass)", ip)
		}
		c.forget(k)
	}
	for k := range c.reported {
		if s, ok := byKey[strings.SplitN(k, "|", 2)[0]]; !ok || !handles(s) {
			delete(c.reported, k)
		}
	}

	// 2. Keep what is allocated, and take back the addresses the Services already carry in
	// their status (after a restart of gatehouse-lb), before handing out anything new.
	for _, s := range ours {
		k := key(s)
		req, reqOK := requested(s)
		if ip, ok := c.alloc.lookup(k); ok {
			if s.Spec.LoadBalancerIP != "" && (!reqOK || req != ip) {
				c.alloc.release(k)
				log.Printf("%s: spec.loadBalancerIP is now %q; released %s", k, s.Spec.LoadBalancerIP, ip)
			}
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			ip, err := netip.ParseAddr(ing.IP)
			if err != nil || (s.Spec.LoadBalancerIP != "" && (!reqOK || ip.Unmap() != req)) {
				continue
			}
			if c.alloc.claim(k, ip) {
				log.Printf("%s: kept %s (from its status)", k, ip.Unmap())
				c.reported[k+"|alloc"] = "ok " + ip.Unmap().String()
				break
			}
		}
	}

	// 3. Allocate: spec.loadBalancerIP if it is in range and free, else the lowest free
	// address. A request that cannot be met gets no address (like a cloud provider), and an
	// Event and a False condition that say why.
	outcomes := map[string]outcome{}
	for _, s := range ours {
		k := key(s)
		if ip, ok := c.alloc.lookup(k); ok {
			how := ""
			if s.Spec.LoadBalancerIP != "" {
				how = " (spec.loadBalancerIP)"
			}
			outcomes[k] = outcome{ip: ip, reason: "Allocated", message: fmt.Sprintf("%s%s from %s", ip, how, c.alloc.prefix)}
			continue
		}
		var o outcome
		if s.Spec.LoadBalancerIP != "" {
			req, ok := requested(s)
			switch {
			case !ok:
				o = outcome{reason: "InvalidRequestedAddress", message: fmt.Sprintf("spec.loadBalancerIP %q is not an IP address", s.Spec.LoadBalancerIP)}
			case !c.alloc.contains(req):
				o = outcome{reason: "RequestedAddressOutOfRange", message: fmt.Sprintf("spec.loadBalancerIP %s is not in the address range %s (usable %s-%s)", req, c.alloc.prefix, c.alloc.first, c.alloc.last)}
			default:
				if holder, taken := c.alloc.holder(req); taken {
					o = outcome{reason: "RequestedAddressInUse", message: fmt.Sprintf("spec.loadBalancerIP %s is in use by Service %s", req, holder)}
				} else {
					c.alloc.claim(k, req)
					o = outcome{ip: req, reason: "Allocated", message: fmt.Sprintf("%s (spec.loadBalancerIP) from %s", req, c.alloc.prefix)}
				}
			}
		} else if ip, ok := c.alloc.next(k); ok {
			o = outcome{ip: ip, reason: "Allocated", message: fmt.Sprintf("%s from %s", ip, c.alloc.prefix)}
		} else {
			o = outcome{reason: "AddressRangeExhausted", message: fmt.Sprintf("no free address left in %s", c.alloc.prefix)}
		}
		outcomes[k] = o
		if o.ip.IsValid() {
			if c.report(k, "alloc", "ok "+o.ip.String()) {
				log.Printf("%s: allocated %s", k, o.message)
				c.recorder.Eventf(s, corev1.EventTypeNormal, "AddressAllocated", "Allocated %s", o.message)
			}
		} else if c.report(k, "alloc", o.reason+" "+o.message) {
			log.Printf("%s: no address: %s", k, o.message)
			c.recorder.Event(s, corev1.EventTypeWarning, "AllocationFailed", o.message)
		}
	}

	// 4. haproxy: one frontend per (Service, TCP port) that has an address; the UDP
	// forwarder (udp.go): one socket per (Service, UDP port).
	want := map[string]*frontend{}
	wantUDP := map[string]*udpFrontend{}
	for _, s := range ours {
		ip := outcomes[key(s)].ip
		if !ip.IsValid() {
			continue
		}
		eps, err := c.slices.EndpointSlices(s.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name}))
		if err != nil {
			return err
		}
		balance := "roundrobin"
		if s.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			balance = "source"
		}
		for _, sp := range s.Spec.Ports {
			if sp.Protocol == corev1.ProtocolUDP {
				name := udpFrontendName(s.Namespace, s.Name, sp.Port)
				wantUDP[name] = &udpFrontend{
					name:    name,
					service: key(s),
					bind:    netip.AddrPortFrom(ip, uint16(sp.Port)),
					want:    endpointsFor(sp, addressFamily(ip), eps),
				}
				continue
			}
			if sp.Protocol != "" && sp.Protocol != corev1.ProtocolTCP {
				continue
			}
			name := frontendName(s.Namespace, s.Name, sp.Port)
			comment := fmt.Sprintf("%d/TCP", sp.Port)
			if sp.Name != "" {
				comment += fmt.Sprintf(" (%q)", sp.Name)
			}
			want[name] = &frontend{
				name:    name,
				service: key(s),
				comment: comment,
				bind:    netip.AddrPortFrom(ip, uint16(sp.Port)),
				balance: balance,
				want:    endpointsFor(sp, addressFamily(ip), eps),
			}
		}
	}
	applyErr := c.lb.apply(want)
	c.udp.apply(wantUDP)

	// 5. Status and Events.
	var errs []error
	if applyErr != nil {
		errs = append(errs, applyErr)
	}
	for _, s := range all {
		if !handles(s) {
			// The type changed away from LoadBalancer: the API server has cleared
			// status.loadBalancer; drop our condition too.
			if s.Spec.Type != corev1.ServiceTypeLoadBalancer && (meta.FindStatusCondition(s.Status.Conditions, conditionType) != nil || c.carriesOurAddress(s)) {
				if err := c.writeStatus(ctx, s, corev1.LoadBalancerStatus{}, nil); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		k := key(s)
		o := outcomes[k]
		cond := metav1.Condition{Type: conditionType, Status: metav1.ConditionFalse, Reason: o.reason,
			Message: o.message, ObservedGeneration: s.Generation}
		var lbStatus corev1.LoadBalancerStatus
		if o.ip.IsValid() {
			cond.Status = metav1.ConditionTrue
			vip := corev1.LoadBalancerIPModeVIP
			ing := corev1.LoadBalancerIngress{IP: o.ip.String(), IPMode: &vip}
			var unsupported []string
			for _, sp := range s.Spec.Ports {
				ps := corev1.PortStatus{Port: sp.Port, Protocol: sp.Protocol}
				if ps.Protocol == "" {
					ps.Protocol = corev1.ProtocolTCP
				}
				if e := c.portError(s, sp); e != "" {
					ps.Error = &e
					if e == portErrUnsupportedProtocol {
						unsupported = append(unsupported, fmt.Sprintf("%d/%s", sp.Port, sp.Protocol))
					}
				}
				ing.Ports = append(ing.Ports, ps)
			}
			lbStatus.Ingress = []corev1.LoadBalancerIngress{ing}
			if len(unsupported) > 0 && c.report(k, "proto", strings.Join(unsupported, ",")) {
				c.recorder.Eventf(s, corev1.EventTypeWarning, "UnsupportedProtocol", "gatehouse-lb forwards TCP and UDP only; not forwarded: %s", strings.Join(unsupported, ", "))
			}
		}
		if err := c.writeStatus(ctx, s, lbStatus, &cond); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// carriesOurAddress says whether a Service's status names an address of our range (the API
// server clears status.loadBalancer when the type changes away from LoadBalancer, unless
// the AllowServiceLBStatusOnNonLB feature gate is on).
func (c *controller) carriesOurAddress(s *corev1.Service) bool {
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ip, err := netip.ParseAddr(ing.IP); err == nil && c.alloc.contains(ip) {
			return true
		}
	}
	return false
}

// portError is the status error of one Service port, "" when it is forwarded.
func (c *controller) portError(s *corev1.Service, sp corev1.ServicePort) string {
	serving, listenErr := c.lb.serving, func(name string) error { return c.lb.listenErr[name] }
	name := frontendName(s.Namespace, s.Name, sp.Port)
	switch sp.Protocol {
	case "", corev1.ProtocolTCP:
	case corev1.ProtocolUDP:
		serving, listenErr = c.udp.serving, c.udp.err
		name = udpFrontendName(s.Namespace, s.Name, sp.Port)
	default:
		return portErrUnsupportedProtocol
	}
	if serving(name) {
		c.report(key(s), "listen "+name, "")
		return ""
	}
	if err := listenErr(name); err != nil {
		if c.report(key(s), "listen "+name, err.Error()) {
			c.recorder.Eventf(s, corev1.EventTypeWarning, "ListenFailed", "Cannot listen on port %d: %v", sp.Port, err)
		}
		return portErrListenFailed
	}
	return portErrNotServing
}

// report records the latest state of one kind for a Service and says whether it changed.
func (c *controller) report(k, kind, state string) bool {
	id := k + "|" + kind
	if c.reported[id] == state {
		return false
	}
	if state == "" {
		delete(c.reported, id)
	} else {
		c.reported[id] = state
	}
	return true
}

func (c *controller) forget(k string) {
	for id := range c.reported {
		if strings.HasPrefix(id, k+"|") {
			delete(c.reported, id)
		}
	}
}

// requested parses spec.loadBalancerIP (deprecated upstream, still the way to ask for an
// address).
func requested(s *corev1.Service) (netip.Addr, bool) {
	if s.Spec.LoadBalancerIP == "" {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(s.Spec.LoadBalancerIP)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// writeStatus sets status.loadBalancer and our condition (nil: remove it), leaving other
// writers' conditions alone; it writes only when something changed. A conflict is
// retried by the next sync, which sees the newer object.
func (c *controller) writeStatus(ctx context.Context, s *corev1.Service, lb corev1.LoadBalancerStatus, cond *metav1.Condition) error {
	st := s.Status.DeepCopy()
	st.LoadBalancer = lb
	if cond != nil {
		meta.SetStatusCondition(&st.Conditions, *cond)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, conditionType)
	}
	if equality.Semantic.DeepEqual(s.Status, *st) {
		return nil
	}
	cp := s.DeepCopy()
	cp.Status = *st
	_, err := c.client.CoreV1().Services(s.Namespace).UpdateStatus(ctx, cp, metav1.UpdateOptions{FieldManager: "gatehouse-lb"})
	if err != nil {
		return fmt.Errorf("%s: writing status: %w", key(s), err)
	}
	return nil
}
