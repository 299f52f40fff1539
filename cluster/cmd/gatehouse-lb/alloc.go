package main

import (
	"fmt"
	"net/netip"
)

// allocator hands out addresses of one prefix, one per Service (keyed "namespace/name").
// It holds no state of its own beyond memory: on start the controller rebuilds it from the
// addresses the Services carry in status.loadBalancer.ingress.
type allocator struct {
	prefix      netip.Prefix
	first, last netip.Addr // usable range, inclusive
	byAddr      map[netip.Addr]string
	byKey       map[string]netip.Addr
}

func newAllocator(p netip.Prefix) (*allocator, error) {
	p = p.Masked()
	first := p.Addr()
	last := lastAddr(p)
	bits := p.Addr().BitLen()
	// Leave out the network address, and for IPv4 the broadcast address, unless the prefix
	// is so small that nothing would be left (/31, /32, /127, /128).
	if p.Bits() < bits-1 {
		first = first.Next()
		if p.Addr().Is4() {
			last = last.Prev()
		}
	}
	if !first.IsValid() || !last.IsValid() || last.Less(first) {
		return nil, fmt.Errorf("%s has no usable address", p)
	}
	return &allocator{prefix: p, first: first, last: last,
		byAddr: map[netip.Addr]string{}, byKey: map[string]netip.Addr{}}, nil
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// contains says whether a is one of the addresses this allocator hands out.
func (a *allocator) contains(ip netip.Addr) bool {
	ip = ip.Unmap()
	return a.prefix.Contains(ip) && !ip.Less(a.first) && !a.last.Less(ip)
}

func (a *allocator) lookup(key string) (netip.Addr, bool) {
	ip, ok := a.byKey[key]
	return ip, ok
}

// holder returns the key that holds ip, if any.
func (a *allocator) holder(ip netip.Addr) (string, bool) {
	k, ok := a.byAddr[ip.Unmap()]
	return k, ok
}

// claim gives ip to key if it is in range and free (or already key's).
func (a *allocator) claim(key string, ip netip.Addr) bool {
	ip = ip.Unmap()
	if !a.contains(ip) {
		return false
	}
	if k, ok := a.byAddr[ip]; ok {
		return k == key
	}
	if old, ok := a.byKey[key]; ok {
		delete(a.byAddr, old)
	}
	a.byAddr[ip] = key
	a.byKey[key] = ip
	return true
}

// next gives key the lowest free address.
func (a *allocator) next(key string) (netip.Addr, bool) {
	if ip, ok := a.byKey[key]; ok {
		return ip, true
	}
	for ip := a.first; ip.IsValid(); ip = ip.Next() {
		if _, used := a.byAddr[ip]; !used {
			a.byAddr[ip] = key
			a.byKey[key] = ip
			return ip, true
		}
		if ip == a.last {
			break
		}
	}
	return netip.Addr{}, false
}

func (a *allocator) release(key string) (netip.Addr, bool) {
	ip, ok := a.byKey[key]
	if ok {
		delete(a.byKey, key)
		delete(a.byAddr, ip)
	}
	return ip, ok
}

func (a *allocator) keys() []string {
	out := make([]string, 0, len(a.byKey))
	for k := range a.byKey {
		out = append(out, k)
	}
	return out
}
