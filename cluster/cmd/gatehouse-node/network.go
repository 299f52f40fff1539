package main

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// podNetwork is a Linux bridge carrying the node IP (first address of the pod CIDR) with
// one veth pair per pod; the pod end is eth0 in the pod's network namespace. The host
// reaches pods directly over the bridge, which is how Gatehouse (on the host) reaches the
// backends behind EndpointSlices.
//
// For Service traffic (proxy.go) the bridge forwards IPv4 (net.ipv4.conf.<bridge>.forwarding:
// a Pod's connection to a ClusterIP is DNATed to another Pod on the same bridge, or beyond)
// and routes to loopback (route_localnet: the `kubernetes` Service is DNATed to the API
// server on 127.0.0.1). Both are settings of this bridge only, gone with it; the host's
// net.ipv4.ip_forward is not touched. The veths are in hairpin mode, as the kubelet sets them,
// so that a Pod can reach itself through a Service.
type podNetwork struct {
	bridge  string
	prefixN string // network namespace name prefix
	cidr    *net.IPNet
	gateway net.IP
	prefix  int

	mu   sync.Mutex
	used map[uint32]bool
	next uint32 // where allocate looks first: after the last address it gave out
}

func newPodNetwork(bridge, cidr, netnsPrefix string) (*podNetwork, error) {
	gw, ipnet, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, fmt.Errorf("--pod-cidr: %w", err)
	}
	if gw.To4() == nil {
		return nil, fmt.Errorf("--pod-cidr: only IPv4 is supported")
	}
	prefix, _ := ipnet.Mask.Size()
	if prefix > 28 {
		return nil, fmt.Errorf("--pod-cidr %s is too small", cidr)
	}
	gw = addIP(ipnet.IP, 1)
	n := &podNetwork{bridge: bridge, prefixN: netnsPrefix, cidr: ipnet, gateway: gw, prefix: prefix, used: map[uint32]bool{}}
	// A bridge left by an earlier run that died would hold the same address: start clean.
	_ = ip("link", "del", bridge)
	// The bridge gets a fixed address of its own. Without one, Linux gives a bridge the lowest
	// address among its ports and changes it whenever that port leaves: deleting the one Pod
	// whose veth had the lowest address moved the node's MAC, and every other Pod kept sending
	// its replies to the host (the load balancer's and the probes' connections) to the old
	// address, which nothing answered any more, until its neighbour entry happened to be
	// refreshed: seconds to tens of seconds in which a data plane's clients got nothing (the
	// stalls of bench/nfr's soak while backends re-rolled). CNI bridge plugins set it for the
	// same reason.
	if err := ip("link", "add", bridge, "address", bridgeMAC(bridge), "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ip("addr", "add", fmt.Sprintf("%s/%d", gw, prefix), "dev", bridge); err != nil {
		return nil, err
	}
	if err := ip("link", "set", bridge, "up"); err != nil {
		return nil, err
	}
	for _, k := range []string{"forwarding", "route_localnet"} {
		if err := os.WriteFile(filepath.Join("/proc/sys/net/ipv4/conf", bridge, k), []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("net.ipv4.conf.%s.%s: %w", bridge, k, err)
		}
	}
	return n, nil
}

// bridgeMAC is a locally administered unicast address derived from the bridge's name, so it
// is stable across restarts and differs between the bridges of several nodes on one host.
func bridgeMAC(bridge string) string {
	sum := sha256.Sum256([]byte("gatehouse-node bridge " + bridge))
	sum[0] = sum[0]&0xfc | 0x02 // locally administered, unicast
	return net.HardwareAddr(sum[:6]).String()
}

func (n *podNetwork) teardown() {
	_ = ip("link", "del", n.bridge)
}

func addIP(base net.IP, off uint32) net.IP {
	v := binary.BigEndian.Uint32(base.To4()) + off
	out := make(net.IP, 4)
	binary.BigEndian.PutUint32(out, v)
	return out
}

// allocate returns a free pod address (never the network, node or broadcast address). It
// goes round the range, as CNI's host-local IPAM does, rather than taking the lowest free
// address: a Pod's address is then not handed to the next Pod right after its owner is
// deleted, while peers may still hold a neighbour entry with the old Pod's MAC (see attach).
func (n *podNetwork) allocate() (net.IP, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	size := uint32(1) << (32 - n.prefix)
	hosts := size - 3 // offsets 2 .. size-2
	if n.next < 2 || n.next > size-2 {
		n.next = 2
	}
	for i := uint32(0); i < hosts; i++ {
		off := 2 + (n.next-2+i)%hosts
		if !n.used[off] {
			n.used[off] = true
			n.next = off + 1
			return addIP(n.cidr.IP, off), nil
		}
	}
	return nil, fmt.Errorf("pod network %s is full", n.cidr)
}

func (n *podNetwork) release(addr net.IP) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.used, binary.BigEndian.Uint32(addr.To4())-binary.BigEndian.Uint32(n.cidr.IP.To4()))
}

// names derives the namespace and host-side veth names from the pod UID; interface
// names are limited to 15 bytes.
func (n *podNetwork) names(uid string) (netns, hostVeth string) {
	sum := sha256.Sum256([]byte(uid))
	h := hex.EncodeToString(sum[:])[:10]
	return n.prefixN + h, "ghv" + h
}

func (n *podNetwork) attach(uid string, addr net.IP) (string, error) {
	netns, veth := n.names(uid)
	_ = ip("netns", "del", netns)
	steps := [][]string{
		{"netns", "add", netns},
		{"link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns},
		{"link", "set", veth, "master", n.bridge, "up"},
		{"link", "set", veth, "type", "bridge_slave", "hairpin", "on"},
		{"-n", netns, "addr", "add", fmt.Sprintf("%s/%d", addr, n.prefix), "dev", "eth0"},
		{"-n", netns, "link", "set", "eth0", "up"},
		{"-n", netns, "link", "set", "lo", "up"},
		{"-n", netns, "route", "add", "default", "via", n.gateway.String()},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			n.detach(uid)
			return "", err
		}
	}
	// The node may still hold a neighbour entry for this address with the MAC of an earlier
	// Pod's eth0. The kernel trusts a REACHABLE entry for up to ~45 s without asking again, and
	// only TCP confirms reachability; UDP datagrams to the new Pod went to the old MAC and were
	// lost for that long (the conformance suite's UDPRoute tests, whose backends come and go).
	// Forget it, so the first packet resolves the address anew.
	_ = ip("neigh", "del", addr.String(), "dev", n.bridge)
	return netns, nil
}

func (n *podNetwork) detach(uid string) {
	netns, veth := n.names(uid)
	_ = ip("link", "del", veth)
	_ = ip("netns", "del", netns)
}

func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}
