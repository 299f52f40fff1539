package main

import (
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// endpointsFor returns the addresses a Service port forwards to, the way kube-proxy picks
// them:
//   - EndpointSlices of the Service (the caller selects them by the
//     kubernetes.io/service-name label) of the LoadBalancer address's family;
//   - the slice port whose name and protocol equal the Service port's (an unnamed Service
//     port matches the unnamed slice port); a slice without that port contributes nothing;
//   - endpoints whose conditions.ready is true or unset, by their first address;
//   - if there is none, the endpoints that are terminating but still serving (kube-proxy's
//     fallback, so that a rolling update with no ready endpoint left does not black-hole).
//
// The result is sorted and has no duplicates (one endpoint may appear in two slices while
// the EndpointSlice controller moves it).
func endpointsFor(sp corev1.ServicePort, family discoveryv1.AddressType, eps []*discoveryv1.EndpointSlice) []netip.AddrPort {
	var ready, terminating []netip.AddrPort
	for _, s := range eps {
		if s.AddressType != family {
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
			if err != nil {
				continue
			}
			ap := netip.AddrPortFrom(ip.Unmap(), port)
			isReady := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := isReady
			if ep.Conditions.Serving != nil {
				serving = *ep.Conditions.Serving
			}
			isTerminating := ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			switch {
			case isReady:
				ready = append(ready, ap)
			case serving && isTerminating:
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
		name := ""
		if p.Name != nil {
			name = *p.Name
		}
		proto := corev1.ProtocolTCP
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

// addressFamily is the EndpointSlice address type that matches a LoadBalancer address.
func addressFamily(ip netip.Addr) discoveryv1.AddressType {
	if ip.Is4() {
		return discoveryv1.AddressTypeIPv4
	}
	return discoveryv1.AddressTypeIPv6
}
