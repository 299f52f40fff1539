package main

// What the node knows about Services, shared by the Service environment variables
// (serviceEnv), the ClusterIP rules (proxy.go) and cluster DNS (dns.go). All three read the
// agent's Service and EndpointSlice informer caches through a serviceView.

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
)

// serviceView reads Services and their EndpointSlices from the informer caches.
type serviceView struct {
	services listersv1.ServiceLister
	slices   discoverylisters.EndpointSliceLister
}

// all lists every Service, sorted by namespace and name (deterministic output).
func (v *serviceView) all() []*corev1.Service {
	out, _ := v.services.List(labels.Everything())
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func (v *serviceView) service(ns, name string) *corev1.Service {
	s, err := v.services.Services(ns).Get(name)
	if err != nil {
		return nil
	}
	return s
}

// slicesOf are the EndpointSlices of a Service: those labelled kubernetes.io/service-name
// with its name, in its namespace.
func (v *serviceView) slicesOf(s *corev1.Service) []*discoveryv1.EndpointSlice {
	out, _ := v.slices.EndpointSlices(s.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name}))
	return out
}

// hasClusterIP is the kubelet's test for Services that get environment variables and
// the ClusterIP rules: a ClusterIP that is neither empty (ExternalName) nor None (headless).
func hasClusterIP(s *corev1.Service) bool {
	return s.Spec.ClusterIP != "" && s.Spec.ClusterIP != corev1.ClusterIPNone
}

// clusterIPv4 is the Service's IPv4 ClusterIP (the node is IPv4 only), if it has one.
func clusterIPv4(s *corev1.Service) (netip.Addr, bool) {
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 {
		ips = []string{s.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil && a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// endpointsFor are the IPv4 addresses and ports one Service port sends to, chosen the way
// kube-proxy chooses them:
//   - the slice port whose name and protocol equal the Service port's (an unnamed Service
//     port takes the unnamed slice port; targetPort is not looked at: the EndpointSlice
//     controller has resolved it); a slice without that port contributes nothing;
//   - endpoints whose conditions.ready is true or unset, by their first address;
//   - if there is none, endpoints that are terminating but still serving (kube-proxy's
//     fallback during a rolling update).
//
// Sorted, without duplicates (an endpoint can be in two slices while it moves).
func endpointsFor(sp corev1.ServicePort, eps []*discoveryv1.EndpointSlice) []netip.AddrPort {
	var ready, terminating []netip.AddrPort
	for _, s := range eps {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		port, ok := slicePort(s, sp)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			ip, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || !ip.Is4() {
				continue
			}
			ap := netip.AddrPortFrom(ip, port)
			isReady := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := isReady
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			switch {
			case isReady:
				ready = append(ready, ap)
			case serving && ep.Conditions.Terminating != nil && *ep.Conditions.Terminating:
				terminating = append(terminating, ap)
			}
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}

func slicePort(s *discoveryv1.EndpointSlice, sp corev1.ServicePort) (uint16, bool) {
	want := sp.Protocol
	if want == "" {
		want = corev1.ProtocolTCP
	}
	for _, p := range s.Ports {
		name, proto := "", corev1.ProtocolTCP
		if p.Name != nil {
			name = *p.Name
		}
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		if name != sp.Name || proto != want || p.Port == nil {
			continue
		}
		if *p.Port <= 0 || *p.Port > 65535 {
			return 0, false
		}
		return uint16(*p.Port), true
	}
	return 0, false
}

// serviceEnv is the Service environment of a container in namespace ns, as the kubelet
// computes it: for the `kubernetes` Service of the default namespace always, and for every
// other Service of the Pod's namespace with a ClusterIP when enableServiceLinks is not false
// (a same-named Service of the Pod's own namespace wins over default/kubernetes):
//
//	{NAME}_SERVICE_HOST=<clusterIP>          {NAME}_SERVICE_PORT=<first port>
//	{NAME}_SERVICE_PORT_{PORTNAME}=<port>    (named ports)
//	{NAME}_PORT=<proto>://<clusterIP>:<first port>
//	{NAME}_PORT_{PORT}_{PROTO}=<proto>://<clusterIP>:<port>, and _PROTO, _PORT, _ADDR
//
// NAME and PORTNAME are upper-cased with '-' turned into '_'. The result is sorted by name;
// the container's own env and envFrom come after it and win.
func serviceEnv(services []*corev1.Service, ns string, enableServiceLinks bool) []string {
	chosen := map[string]*corev1.Service{}
	for _, s := range services {
		if !hasClusterIP(s) {
			continue
		}
		switch {
		case s.Namespace == ns && enableServiceLinks:
			chosen[s.Name] = s
		case s.Namespace == corev1.NamespaceDefault && s.Name == "kubernetes":
			if _, ok := chosen[s.Name]; !ok {
				chosen[s.Name] = s
			}
		}
	}
	vars := map[string]string{}
	for _, s := range chosen {
		prefix := envName(s.Name)
		ip := s.Spec.ClusterIP
		vars[prefix+"_SERVICE_HOST"] = ip
		for i, p := range s.Spec.Ports {
			port := strconv.Itoa(int(p.Port))
			proto := string(p.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			lower := strings.ToLower(proto)
			url := fmt.Sprintf("%s://%s", lower, joinHostPort(ip, port))
			if i == 0 {
				vars[prefix+"_SERVICE_PORT"] = port
				vars[prefix+"_PORT"] = url
			}
			if p.Name != "" {
				vars[prefix+"_SERVICE_PORT_"+envName(p.Name)] = port
			}
			pp := prefix + "_PORT_" + port + "_" + strings.ToUpper(proto)
			vars[pp] = url
			vars[pp+"_PROTO"] = lower
			vars[pp+"_PORT"] = port
			vars[pp+"_ADDR"] = ip
		}
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

func envName(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}
