package main

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

func svc(ns, name, clusterIP string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.ServiceSpec{ClusterIP: clusterIP, Ports: ports}}
	if clusterIP != "" {
		s.Spec.ClusterIPs = []string{clusterIP}
	}
	return s
}

func port(name string, p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: p, Protocol: proto}
}

func ptr[T any](v T) *T { return &v }

// slice is an IPv4 EndpointSlice of a Service with one port and the given endpoints
// ("10.245.0.5" ready, "10.245.0.6!" not ready, "10.245.0.7~" terminating and serving,
// "10.245.0.8@web-0" ready with hostname web-0).
func slice(ns, service, name, portName string, p int32, proto corev1.Protocol, eps ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr(portName), Port: ptr(p), Protocol: ptr(proto)}},
	}
	for _, e := range eps {
		ep := discoveryv1.Endpoint{}
		if a, host, ok := strings.Cut(e, "@"); ok {
			e, ep.Hostname = a, ptr(host)
		}
		switch {
		case strings.HasSuffix(e, "!"):
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(false)}
		case strings.HasSuffix(e, "~"):
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
		default:
			ep.Conditions = discoveryv1.EndpointConditions{Ready: ptr(true)}
		}
		ep.Addresses = []string{strings.TrimRight(e, "!~")}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func newView(t *testing.T, objs ...any) *serviceView {
	t.Helper()
	idx := func() cache.Indexer {
		return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	}
	services, slices := idx(), idx()
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Service:
			err = services.Add(o)
		case *discoveryv1.EndpointSlice:
			err = slices.Add(o)
		default:
			t.Fatalf("unexpected %T", o)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return &serviceView{services: listersv1.NewServiceLister(services), slices: discoverylisters.NewEndpointSliceLister(slices)}
}

func kubernetesService() *corev1.Service {
	return svc("default", "kubernetes", "10.96.0.1", port("https", 443, corev1.ProtocolTCP))
}

func TestServiceEnv(t *testing.T) {
	headless := svc("ns1", "headless", corev1.ClusterIPNone, port("", 80, ""))
	external := svc("ns1", "ext", "")
	external.Spec.Type, external.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	services := []*corev1.Service{
		kubernetesService(),
		svc("default", "web", "10.96.0.20", port("", 80, "")),
		svc("ns1", "my-svc", "10.96.3.4", port("http", 80, corev1.ProtocolTCP), port("dns-udp", 53, corev1.ProtocolUDP)),
		headless, external,
		svc("ns2", "other", "10.96.9.9", port("", 80, "")),
	}
	kube := []string{
		"KUBERNETES_PORT=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
		"KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
		"KUBERNETES_PORT_443_TCP_PORT=443",
		"KUBERNETES_PORT_443_TCP_PROTO=tcp",
		"KUBERNETES_SERVICE_HOST=10.96.0.1",
		"KUBERNETES_SERVICE_PORT=443",
		"KUBERNETES_SERVICE_PORT_HTTPS=443",
	}
	mySvc := []string{
		"MY_SVC_PORT=tcp://10.96.3.4:80",
		"MY_SVC_PORT_53_UDP=udp://10.96.3.4:53",
		"MY_SVC_PORT_53_UDP_ADDR=10.96.3.4",
		"MY_SVC_PORT_53_UDP_PORT=53",
		"MY_SVC_PORT_53_UDP_PROTO=udp",
		"MY_SVC_PORT_80_TCP=tcp://10.96.3.4:80",
		"MY_SVC_PORT_80_TCP_ADDR=10.96.3.4",
		"MY_SVC_PORT_80_TCP_PORT=80",
		"MY_SVC_PORT_80_TCP_PROTO=tcp",
		"MY_SVC_SERVICE_HOST=10.96.3.4",
		"MY_SVC_SERVICE_PORT=80",
		"MY_SVC_SERVICE_PORT_DNS_UDP=53",
		"MY_SVC_SERVICE_PORT_HTTP=80",
	}
	sorted := func(parts ...[]string) []string {
		out := slices.Concat(parts...)
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		name  string
		ns    string
		links bool
		want  []string
	}{
		{"own namespace (headless and ExternalName left out) plus kubernetes", "ns1", true, sorted(kube, mySvc)},
		{"enableServiceLinks false: kubernetes only", "ns1", false, kube},
		{"namespace without Services", "empty", true, kube},
		{"the default namespace", "default", true, sorted(kube, []string{
			"WEB_PORT=tcp://10.96.0.20:80", "WEB_PORT_80_TCP=tcp://10.96.0.20:80", "WEB_PORT_80_TCP_ADDR=10.96.0.20",
			"WEB_PORT_80_TCP_PORT=80", "WEB_PORT_80_TCP_PROTO=tcp", "WEB_SERVICE_HOST=10.96.0.20", "WEB_SERVICE_PORT=80",
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := serviceEnv(services, tc.ns, tc.links); !slices.Equal(got, tc.want) {
				t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}

	// A Service named kubernetes in the Pod's own namespace wins over default/kubernetes.
	own := svc("ns1", "kubernetes", "10.96.7.7", port("", 8443, ""))
	got := serviceEnv([]*corev1.Service{kubernetesService(), own}, "ns1", true)
	if !slices.Contains(got, "KUBERNETES_SERVICE_HOST=10.96.7.7") || slices.Contains(got, "KUBERNETES_SERVICE_HOST=10.96.0.1") {
		t.Errorf("own kubernetes Service: %v", got)
	}
}

// The Pod's env overrides the Service variables and can refer to them.
func TestServiceEnvPrecedence(t *testing.T) {
	base := append([]string{"PATH=/bin"}, serviceEnv([]*corev1.Service{kubernetesService()}, "default", true)...)
	rt := &podRuntime{pod: &corev1.Pod{}}
	c := &corev1.Container{Env: []corev1.EnvVar{
		{Name: "KUBERNETES_SERVICE_PORT", Value: "6443"},
		{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
	}}
	env, err := rt.containerEnv(context.Background(), c, base)
	if err != nil {
		t.Fatal(err)
	}
	final := map[string]string{}
	for _, e := range env { // exec keeps the last of duplicate names
		k, v, _ := strings.Cut(e, "=")
		final[k] = v
	}
	if final["KUBERNETES_SERVICE_PORT"] != "6443" || final["API"] != "https://10.96.0.1:6443" || final["KUBERNETES_SERVICE_HOST"] != "10.96.0.1" {
		t.Errorf("env: %v", final)
	}
}

func TestEndpointsFor(t *testing.T) {
	sp := port("http", 80, corev1.ProtocolTCP)
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name   string
		slices []*discoveryv1.EndpointSlice
		want   []netip.AddrPort
	}{
		{"ready ones, sorted, deduplicated across slices", []*discoveryv1.EndpointSlice{
			slice("d", "web", "a", "http", 8080, corev1.ProtocolTCP, "10.245.0.6", "10.245.0.5!", "10.245.0.4"),
			slice("d", "web", "b", "http", 8080, corev1.ProtocolTCP, "10.245.0.4"),
		}, []netip.AddrPort{ap("10.245.0.4:8080"), ap("10.245.0.6:8080")}},
		{"terminating but serving when none is ready", []*discoveryv1.EndpointSlice{
			slice("d", "web", "a", "http", 8080, corev1.ProtocolTCP, "10.245.0.7~", "10.245.0.5!"),
		}, []netip.AddrPort{ap("10.245.0.7:8080")}},
		{"port name must match", []*discoveryv1.EndpointSlice{
			slice("d", "web", "a", "metrics", 9090, corev1.ProtocolTCP, "10.245.0.4"),
		}, nil},
		{"protocol must match", []*discoveryv1.EndpointSlice{
			slice("d", "web", "a", "http", 8080, corev1.ProtocolUDP, "10.245.0.4"),
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := endpointsFor(sp, tc.slices); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}
