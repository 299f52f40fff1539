package main

// A minimal kube-proxy for this node's Pods: connections from a Pod to a Service's
// ClusterIP:port (TCP and UDP) are DNATed to one of the Service's endpoints, picked at
// random per connection. The rules live in one nftables table per node,
// `ip gatehouse-node-<bridge>`, and only match traffic that enters the host from the node's
// bridge (`iifname <bridge>`), so several clusters — each with its own node, bridge and the
// same ClusterIPs (10.96.0.1 is every cluster's `kubernetes` Service) — coexist on one
// machine. The whole table is rendered from the informer caches and replaced in one nft
// transaction whenever a Service or EndpointSlice changes (established connections keep
// their conntrack NAT binding); it is deleted when the agent exits, and a table left by an
// agent that was killed is replaced at start (cluster/down deletes it too).
//
//	table ip gatehouse-node-ghn7 {
//		chain prerouting { type nat hook prerouting priority dstnat; iifname "ghn7" jump services }
//		chain services {        # one rule per Service port with endpoints
//			ip daddr 10.96.0.1 tcp dport 443 jump svc/default/kubernetes/443/tcp
//			ip daddr 10.96.12.7 tcp dport 80 jump svc/default/web/80/tcp
//		}
//		chain svc/default/web/80/tcp { numgen random mod 2 vmap { 0 : jump ep/..., 1 : jump ep/... } }
//		chain ep/default/web/80/tcp/10.245.7.3/8080 { meta l4proto tcp dnat to 10.245.7.3:8080 }
//		chain postrouting { ... masquerade the hairpin case ... }
//		chain no-endpoints { ... refuse connections to Service ports without endpoints ... }
//		chain forward { ... reject other traffic leaving the bridge ... }
//		chain input { ... drop loopback-addressed packets from the bridge that were not DNATed ... }
//	}
//
// The `kubernetes` Service of the default namespace has no endpoints (the API server's
// endpoint reconciler is off: its loopback address may not be published), so its ports are
// DNATed to the API server address of the agent's kubeconfig. That address is on loopback,
// which the kernel only routes to from another interface with
// net.ipv4.conf.<bridge>.route_localnet=1 (set by newPodNetwork, as kube-proxy does for
// localhost NodePorts); the input chain drops every other packet from the bridge to
// 127.0.0.0/8, as kube-proxy does (CVE-2020-8558).
//
// A Service port without endpoints refuses connections: TCP with a reset, UDP with ICMP port
// unreachable (kube-proxy sends ICMP for both; a reset is not subject to the kernel's ICMP
// rate limit, which the redirects of the fallback below can exhaust, so a TCP client is
// refused at once either way). This happens in a filter chain on the prerouting hook, before
// the routing decision, so it does not depend on the host having a route for the ClusterIP
// (without one, a forward-hook rule would never see the packet); its priority is after
// dstnat, so packets of established connections, already carrying their endpoint's address,
// are never refused when the last endpoint goes.
//
// Pod to Pod through a Service. The first packet always reaches the host (a ClusterIP is off
// the bridge's subnet) and is DNATed there; the reply goes straight from Pod to Pod across
// the bridge, which conntrack sees only if bridged IPv4 passes netfilter. brNetfilter decides,
// at every render:
//   - br_netfilter on (net.bridge.bridge-nf-call-iptables=1: the module is loaded, or built
//     in, and not turned off): the Pod keeps its source address and conntrack un-NATs the
//     bridged reply. Only the hairpin case, a Pod reaching a Service whose chosen endpoint is
//     itself, is masqueraded to the node address (it would otherwise answer itself directly,
//     bypassing the reverse NAT); the veths are in hairpin mode (the kubelet's default,
//     hairpin-veth) so the bridge may send such a frame back out of the port it came in on.
//   - br_netfilter off (a fresh Debian: nothing loads the module, and the agent loads none):
//     every DNATed connection from a Pod to a Pod is masqueraded to the node address, so the
//     reply comes back through the host, which un-NATs it; the endpoint sees the node
//     address. The host routes these packets back out of the bridge and so sends the client
//     ICMP redirects; they name the endpoint's own address, which the Pod reaches on the
//     bridge anyway, so they change nothing (send_redirects cannot be turned off per
//     interface; the host-wide setting is left alone).

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// proxyPort is one Service port and the endpoints its ClusterIP:port is sent to.
type proxyPort struct {
	service   string // namespace/name
	name      string // the Service port's name ("" if unnamed)
	clusterIP netip.Addr
	port      uint16
	proto     string // "tcp" or "udp"
	endpoints []netip.AddrPort
}

// proxyPorts lists the Service ports that get rules: IPv4 ClusterIP Services, TCP and UDP
// ports (SCTP is left out), sorted by Service. The ports of default/kubernetes go to
// apiServer when it is an IPv4 address (not ::ffff:a.b.c.d: see apiServerAddr).
func proxyPorts(services []*corev1.Service, slicesOf func(*corev1.Service) []*discoveryv1.EndpointSlice, apiServer netip.AddrPort) []proxyPort {
	var out []proxyPort
	for _, s := range services {
		if !hasClusterIP(s) || s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		ip, ok := clusterIPv4(s)
		if !ok {
			continue
		}
		isAPI := s.Namespace == corev1.NamespaceDefault && s.Name == "kubernetes" && apiServer.IsValid() && apiServer.Addr().Is4()
		var eps []*discoveryv1.EndpointSlice
		if !isAPI {
			eps = slicesOf(s)
		}
		for _, sp := range s.Spec.Ports {
			proto := strings.ToLower(string(sp.Protocol))
			if proto == "" {
				proto = "tcp"
			}
			if proto != "tcp" && proto != "udp" || sp.Port <= 0 || sp.Port > 65535 {
				continue
			}
			p := proxyPort{service: s.Namespace + "/" + s.Name, name: sp.Name, clusterIP: ip, port: uint16(sp.Port), proto: proto}
			switch {
			case isAPI && proto == "tcp":
				p.endpoints = []netip.AddrPort{apiServer}
			case !isAPI:
				p.endpoints = endpointsFor(sp, eps)
			}
			out = append(out, p)
		}
	}
	return out
}

// ruleSet is everything renderRules needs.
type ruleSet struct {
	table, bridge string
	podCIDR       netip.Prefix
	brNetfilter   bool // bridged IPv4 traffic passes netfilter (bridge-nf-call-iptables=1)
	ports         []proxyPort
}

// proxyTable is the name of a node's nftables table.
func proxyTable(bridge string) string { return "gatehouse-node-" + bridge }

// renderRules is the nft script that replaces the node's table atomically: creating the
// table first makes the delete succeed when it does not exist yet.
func renderRules(rs ruleSet) string {
	var b strings.Builder
	w := func(indent int, format string, args ...any) {
		b.WriteString(strings.Repeat("\t", indent))
		fmt.Fprintf(&b, format, args...)
		b.WriteByte('\n')
	}
	br := fmt.Sprintf("%q", rs.bridge)
	w(0, "table ip %s {}", rs.table)
	w(0, "delete table ip %s", rs.table)
	w(0, "table ip %s {", rs.table)

	w(1, "chain prerouting {")
	w(2, "type nat hook prerouting priority dstnat; policy accept;")
	w(2, "iifname %s jump services", br)
	w(1, "}")

	type chain struct {
		name  string
		rules []string
	}
	var chains []chain
	var services, noEndpoints []string
	hairpin := map[netip.Addr]bool{}
	for _, p := range rs.ports {
		label := p.service + ":" + p.portLabel()
		match := fmt.Sprintf("ip daddr %s %s dport %d", p.clusterIP, p.proto, p.port)
		if len(p.endpoints) == 0 {
			refuse := "reject" // ICMP port unreachable
			if p.proto == "tcp" {
				refuse = "reject with tcp reset"
			}
			noEndpoints = append(noEndpoints, fmt.Sprintf("iifname %s %s %s comment %s", br, match, refuse, comment(label+" has no endpoints")))
			continue
		}
		svcChain := fmt.Sprintf("svc/%s/%d/%s", p.service, p.port, p.proto)
		services = append(services, fmt.Sprintf("%s jump %s comment %s", match, svcChain, comment(label)))
		var targets []string
		var epChains []chain
		for _, ep := range p.endpoints {
			epChain := fmt.Sprintf("ep/%s/%d/%s/%s/%d", p.service, p.port, p.proto, ep.Addr(), ep.Port())
			targets = append(targets, epChain)
			epChains = append(epChains, chain{epChain, []string{fmt.Sprintf("meta l4proto %s dnat to %s", p.proto, ep)}})
			if rs.podCIDR.Contains(ep.Addr()) {
				hairpin[ep.Addr()] = true
			}
		}
		pick := "jump " + targets[0]
		if len(targets) > 1 {
			var m []string
			for i, t := range targets {
				m = append(m, fmt.Sprintf("%d : jump %s", i, t))
			}
			pick = fmt.Sprintf("numgen random mod %d vmap { %s }", len(targets), strings.Join(m, ", "))
		}
		chains = append(append(chains, chain{svcChain, []string{pick}}), epChains...)
	}

	w(1, "chain services {")
	for _, r := range services {
		w(2, "%s", r)
	}
	w(1, "}")
	for _, c := range chains {
		w(1, "chain %s {", c.name)
		for _, r := range c.rules {
			w(2, "%s", r)
		}
		w(1, "}")
	}

	w(1, "chain postrouting {")
	w(2, "type nat hook postrouting priority srcnat; policy accept;")
	if rs.brNetfilter {
		if len(hairpin) > 0 {
			var pairs []string
			for _, a := range sortedAddrs(hairpin) {
				pairs = append(pairs, fmt.Sprintf("%s . %s", a, a))
			}
			w(2, "oifname %s ct status dnat ip saddr . ip daddr { %s } masquerade comment %s", br, strings.Join(pairs, ", "), comment("hairpin: a pod reaching itself through a Service"))
		}
	} else {
		w(2, "oifname %s ct status dnat ip saddr %s masquerade comment %s", br, rs.podCIDR, comment("pod to pod through a Service without br_netfilter"))
	}
	w(2, "oifname != %s ct status dnat ip saddr %s masquerade comment %s", br, rs.podCIDR, comment("endpoints outside the pod network"))
	w(1, "}")

	w(1, "chain no-endpoints {")
	w(2, "type filter hook prerouting priority filter; policy accept;")
	for _, r := range noEndpoints {
		w(2, "%s", r)
	}
	w(1, "}")

	w(1, "chain forward {")
	w(2, "type filter hook forward priority filter; policy accept;")
	w(2, "iifname %s oifname != %s ct status & dnat == 0 reject with icmp type host-unreachable comment %s", br, br, comment("pods reach only the bridge and Service endpoints"))
	w(1, "}")

	w(1, "chain input {")
	w(2, "type filter hook input priority filter; policy accept;")
	w(2, "iifname %s ip daddr 127.0.0.0/8 ct status & dnat == 0 drop comment %s", br, comment("route_localnet is for the kubernetes Service only"))
	w(1, "}")
	w(0, "}")
	return b.String()
}

func (p proxyPort) portLabel() string {
	if p.name != "" {
		return p.name
	}
	return fmt.Sprintf("%d/%s", p.port, p.proto)
}

// comment quotes an nft comment (at most 128 bytes; names here never contain quotes).
func comment(s string) string {
	if len(s) > 120 {
		s = s[:120]
	}
	return `"` + strings.ReplaceAll(s, `"`, "'") + `"`
}

func sortedAddrs(m map[netip.Addr]bool) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for a := range m {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// serviceProxy keeps the node's table in sync with the Services and EndpointSlices.
type serviceProxy struct {
	table, bridge string
	podCIDR       netip.Prefix
	apiServer     netip.AddrPort
	view          *serviceView
	trigger       chan struct{}

	mu      sync.Mutex
	applied string
}

// newServiceProxy checks that nft works and removes a table an earlier agent on this bridge
// left behind.
func newServiceProxy(bridge string, podCIDR netip.Prefix, apiServer netip.AddrPort) (*serviceProxy, error) {
	for _, r := range bridge {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return nil, fmt.Errorf("--bridge %q: only letters, digits, '-' and '_' (it names the nftables table)", bridge)
		}
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil, fmt.Errorf("the Service ClusterIP rules need nft (Debian package nftables): %w", err)
	}
	p := &serviceProxy{table: proxyTable(bridge), bridge: bridge, podCIDR: podCIDR, apiServer: apiServer, trigger: make(chan struct{}, 1)}
	p.teardown()
	return p, nil
}

// kick asks for a sync (informer event handlers call it).
func (p *serviceProxy) kick() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// sync renders the rules and applies them if they changed.
func (p *serviceProxy) sync() error {
	rules := renderRules(ruleSet{
		table: p.table, bridge: p.bridge, podCIDR: p.podCIDR, brNetfilter: brNetfilter(),
		ports: proxyPorts(p.view.all(), p.view.slicesOf, p.apiServer),
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	if rules == p.applied {
		return nil
	}
	if err := nft(rules); err != nil {
		return err
	}
	p.applied = rules
	return nil
}

// run syncs after every change (bursts coalesced for 50 ms), retrying failures every second,
// until ctx ends, and every brNetfilterRecheck (rendering is cheap; nft runs only when the
// rules changed). A failure is logged when it first happens (with nft's whole message) and
// when it is over, not on every retry.
func (p *serviceProxy) run(ctx context.Context) {
	failing := ""
	recheck := time.NewTicker(brNetfilterRecheck)
	defer recheck.Stop()
	for {
		var retry <-chan time.Time
		if err := p.sync(); err != nil {
			if err.Error() != failing {
				log.Printf("service rules: %v (retrying every second)", err)
			}
			failing = err.Error()
			retry = time.After(time.Second)
		} else if failing != "" {
			log.Printf("service rules: applied")
			failing = ""
		}
		select {
		case <-ctx.Done():
			return
		case <-p.trigger:
		case <-retry:
		case <-recheck.C:
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return
		}
		select {
		case <-p.trigger:
		default:
		}
	}
}

// teardown deletes the node's table (nothing to do if there is none).
func (p *serviceProxy) teardown() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = exec.Command("nft", "delete", "table", "ip", p.table).Run()
	p.applied = ""
}

func nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// brNetfilter reports whether bridged IPv4 traffic passes netfilter, so that conntrack
// un-NATs a reply that goes straight from one Pod to another across the bridge: the sysctl
// br_netfilter registers (per network namespace) is 1. Without the module the file does not
// exist. Read at every render, and run re-renders every brNetfilterRecheck, so the rules
// follow a module loaded (e.g. by Docker) or a sysctl changed while the agent runs.
func brNetfilter() bool {
	b, err := os.ReadFile("/proc/sys/net/bridge/bridge-nf-call-iptables")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

const brNetfilterRecheck = 10 * time.Second
