package main

// Cluster DNS: a small server in the agent, on the node's bridge address, port 53 (UDP and
// TCP), that Pods with dnsPolicy ClusterFirst use as their nameserver. It answers from the
// informer caches, following the Kubernetes DNS specification for Services
// (github.com/kubernetes/dns, docs/specification.md), authoritatively for the cluster
// domain (cluster.local):
//
//	<svc>.<ns>.svc.cluster.local       A: the ClusterIP; a headless Service: the addresses of
//	                                   its ready endpoints (all of them with
//	                                   publishNotReadyAddresses); ExternalName: a CNAME
//	<hostname>.<svc>.<ns>.svc.cluster.local  A: the endpoint of a headless Service with that
//	                                   hostname (StatefulSet Pods)
//	<ns>.svc.cluster.local, svc.cluster.local, cluster.local: no data (NOERROR)
//	anything else in cluster.local     NXDOMAIN
//
// with a 5 s TTL and the zone's SOA with negative answers. A name that exists but has no
// record of the asked type (AAAA: the node is IPv4 only) gets an empty NOERROR answer, so
// that resolvers do not give up on the name. Shorter names (`web`, `web.ns`, `web.ns.svc`)
// are completed by the Pod's resolver from the search list in its /etc/resolv.conf
// (podResolvConf). Every other name is forwarded to the host's nameservers (its
// /etc/resolv.conf), over the protocol the query came in on; SERVFAIL if none answers,
// REFUSED if the host has no nameserver.
// No SRV, PTR or Pod (a-b-c-d.ns.pod) records.

import (
	"fmt"
	"log"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
)

const dnsTTL = 5

type dnsServer struct {
	zone      string   // the cluster domain as a lower-case FQDN, "cluster.local."
	upstreams []string // host:port of the host's nameservers
	view      *serviceView
	servers   []*dns.Server
	closing   atomic.Bool
}

// newDNSServer binds addr:53 over UDP and TCP (serve starts answering).
func newDNSServer(addr net.IP, domain string, upstreams []string) (*dnsServer, error) {
	d := &dnsServer{zone: dns.CanonicalName(domain), upstreams: upstreams}
	hostPort := net.JoinHostPort(addr.String(), "53")
	pc, err := net.ListenPacket("udp4", hostPort)
	if err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	ln, err := net.Listen("tcp4", hostPort)
	if err != nil {
		_ = pc.Close()
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	d.servers = []*dns.Server{
		{PacketConn: pc, Handler: d},
		{Listener: ln, Handler: d},
	}
	return d, nil
}

func (d *dnsServer) serve(view *serviceView) {
	d.view = view
	for _, s := range d.servers {
		go func() {
			if err := s.ActivateAndServe(); err != nil && !d.closing.Load() {
				log.Printf("cluster DNS: %v", err)
			}
		}()
	}
}

func (d *dnsServer) shutdown() {
	d.closing.Store(true)
	for _, s := range d.servers {
		_ = s.Shutdown() // fails if it never started: the sockets are closed anyway
		if s.PacketConn != nil {
			_ = s.PacketConn.Close()
		}
		if s.Listener != nil {
			_ = s.Listener.Close()
		}
	}
}

// ServeDNS answers one query.
func (d *dnsServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	proto := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		proto = "tcp"
	}
	m, forward := d.answer(r)
	if forward {
		m = d.forward(r, proto)
	} else if ext := d.externalTarget(m); ext != "" {
		// An ExternalName Service outside the cluster domain: resolve its target upstream
		// and add the records, as CoreDNS does, since stub resolvers do not chase a CNAME.
		q := new(dns.Msg)
		q.SetQuestion(ext, r.Question[0].Qtype)
		q.RecursionDesired = true
		if up := d.forward(q, proto); up.Rcode == dns.RcodeSuccess {
			m.Answer = append(m.Answer, up.Answer...)
		}
	}
	if proto == "udp" {
		size := dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

// answer is the reply to a query for the cluster domain; forward is true when the name is
// outside it (or the query is not one this server answers: no question, not class IN).
func (d *dnsServer) answer(r *dns.Msg) (m *dns.Msg, forward bool) {
	m = new(dns.Msg)
	m.SetReply(r)
	m.Compress = true
	m.RecursionAvailable = true
	if len(r.Question) != 1 || r.Opcode != dns.OpcodeQuery {
		m.Rcode = dns.RcodeNotImplemented
		return m, false
	}
	q := r.Question[0]
	name := dns.CanonicalName(q.Name)
	if q.Qclass != dns.ClassINET || !dns.IsSubDomain(d.zone, name) {
		return nil, true
	}
	m.Authoritative = true
	rcode, answers := d.lookup(name, q.Qtype, 0)
	m.Rcode = rcode
	for _, rr := range answers {
		// Answer with the name as asked (resolvers may compare case-sensitively).
		if strings.EqualFold(rr.Header().Name, q.Name) {
			rr.Header().Name = q.Name
		}
		m.Answer = append(m.Answer, rr)
	}
	if len(m.Answer) == 0 {
		if q.Qtype == dns.TypeSOA && name == d.zone && rcode == dns.RcodeSuccess {
			m.Answer = append(m.Answer, d.soa())
		} else {
			m.Ns = append(m.Ns, d.soa())
		}
	}
	return m, false
}

// lookup resolves a lower-case FQDN in the cluster domain.
func (d *dnsServer) lookup(name string, qtype uint16, depth int) (int, []dns.RR) {
	labels := dns.SplitDomainName(strings.TrimSuffix(name, d.zone))
	n := len(labels)
	switch {
	case n == 0: // the zone itself
		return dns.RcodeSuccess, nil
	case labels[n-1] != "svc":
		return dns.RcodeNameError, nil
	case n == 1: // svc.<zone>
		return dns.RcodeSuccess, nil
	case n == 2: // <ns>.svc.<zone>
		if svcs, _ := d.view.services.Services(labels[0]).List(everything); len(svcs) > 0 {
			return dns.RcodeSuccess, nil
		}
		return dns.RcodeNameError, nil
	case n > 4:
		return dns.RcodeNameError, nil
	}
	svc := d.view.service(labels[n-2], labels[n-3])
	if svc == nil {
		return dns.RcodeNameError, nil
	}
	if n == 4 { // <hostname>.<svc>.<ns>.svc.<zone>: an endpoint of a headless Service
		if hasClusterIP(svc) {
			return dns.RcodeNameError, nil
		}
		var found []netip.Addr
		for _, ep := range dnsEndpoints(svc, d.view.slicesOf(svc)) {
			if ep.hostname == labels[0] {
				found = append(found, ep.addr)
			}
		}
		if len(found) == 0 {
			return dns.RcodeNameError, nil
		}
		return dns.RcodeSuccess, aRecords(name, qtype, found)
	}
	switch {
	case svc.Spec.Type == corev1.ServiceTypeExternalName:
		target := dns.Fqdn(svc.Spec.ExternalName)
		rrs := []dns.RR{&dns.CNAME{Hdr: hdr(name, dns.TypeCNAME), Target: target}}
		if qtype == dns.TypeCNAME {
			return dns.RcodeSuccess, rrs
		}
		if t := dns.CanonicalName(target); dns.IsSubDomain(d.zone, t) && depth < 8 {
			_, more := d.lookup(t, qtype, depth+1)
			rrs = append(rrs, more...)
		}
		return dns.RcodeSuccess, rrs
	case hasClusterIP(svc):
		var ips []netip.Addr
		if ip, ok := clusterIPv4(svc); ok {
			ips = append(ips, ip)
		}
		return dns.RcodeSuccess, aRecords(name, qtype, ips)
	default: // headless
		var ips []netip.Addr
		for _, ep := range dnsEndpoints(svc, d.view.slicesOf(svc)) {
			ips = append(ips, ep.addr)
		}
		slices.SortFunc(ips, netip.Addr.Compare)
		return dns.RcodeSuccess, aRecords(name, qtype, slices.Compact(ips))
	}
}

var everything = labels.Everything()

func hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: dnsTTL}
}

// aRecords are the A records of ips for an A (or ANY) query; none for other types.
func aRecords(name string, qtype uint16, ips []netip.Addr) []dns.RR {
	if qtype != dns.TypeA && qtype != dns.TypeANY {
		return nil
	}
	var out []dns.RR
	for _, ip := range ips {
		out = append(out, &dns.A{Hdr: hdr(name, dns.TypeA), A: net.IP(ip.AsSlice())})
	}
	return out
}

func (d *dnsServer) soa() dns.RR {
	return &dns.SOA{Hdr: hdr(d.zone, dns.TypeSOA), Ns: "ns.dns." + d.zone, Mbox: "hostmaster." + d.zone,
		Serial: 1, Refresh: 7200, Retry: 1800, Expire: 86400, Minttl: dnsTTL}
}

// externalTarget is the target of a lone CNAME answer (an ExternalName Service) that
// points outside the cluster domain, "" otherwise.
func (d *dnsServer) externalTarget(m *dns.Msg) string {
	if len(m.Answer) != 1 || len(m.Question) != 1 || m.Question[0].Qtype == dns.TypeCNAME {
		return ""
	}
	c, ok := m.Answer[0].(*dns.CNAME)
	if !ok || dns.IsSubDomain(d.zone, dns.CanonicalName(c.Target)) {
		return ""
	}
	return c.Target
}

type dnsEndpoint struct {
	addr     netip.Addr
	hostname string
}

// dnsEndpoints are the IPv4 endpoints DNS publishes for a headless Service: the ready ones,
// or all of them with publishNotReadyAddresses.
func dnsEndpoints(svc *corev1.Service, eps []*discoveryv1.EndpointSlice) []dnsEndpoint {
	var out []dnsEndpoint
	for _, s := range eps {
		if s.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		for _, ep := range s.Endpoints {
			if !svc.Spec.PublishNotReadyAddresses && ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			host := ""
			if ep.Hostname != nil {
				host = *ep.Hostname
			}
			for _, a := range ep.Addresses {
				if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
					out = append(out, dnsEndpoint{ip, host})
				}
			}
		}
	}
	return out
}

// forward asks the host's nameservers, in order, over proto (UDP falls back to TCP for a
// truncated answer); SERVFAIL if none answers, REFUSED if the host has none.
func (d *dnsServer) forward(r *dns.Msg, proto string) *dns.Msg {
	if len(d.upstreams) == 0 {
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeRefused)
		return m
	}
	for _, up := range d.upstreams {
		c := &dns.Client{Net: proto, Timeout: 2 * time.Second}
		resp, _, err := c.Exchange(r, up)
		if err == nil && resp.Truncated && proto == "udp" {
			c.Net = "tcp"
			resp, _, err = c.Exchange(r, up)
		}
		if err == nil {
			resp.Id = r.Id
			return resp
		}
	}
	m := new(dns.Msg)
	m.SetRcode(r, dns.RcodeServerFailure)
	m.RecursionAvailable = true
	return m
}

// resolvConf is what a resolv.conf says, as the kubelet reads it: nameservers, the search
// list (the last search line), options.
type resolvConf struct {
	nameservers, searches, options []string
}

func parseResolvConf(data string) resolvConf {
	var rc resolvConf
	for _, line := range strings.Split(data, "\n") {
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "nameserver":
			if len(f) > 1 {
				rc.nameservers = append(rc.nameservers, f[1])
			}
		case "search":
			rc.searches = nil
			for _, s := range f[1:] {
				if s != "." {
					rc.searches = append(rc.searches, strings.TrimSuffix(s, "."))
				}
			}
		case "options":
			rc.options = append(rc.options, f[1:]...)
		}
	}
	return rc
}

// hostResolvConf reads the host's /etc/resolv.conf (empty if there is none).
func hostResolvConf() resolvConf {
	b, _ := os.ReadFile("/etc/resolv.conf")
	return parseResolvConf(string(b))
}

// upstreamsOf are the host's nameservers as host:53, without the node's own address.
func upstreamsOf(rc resolvConf, self net.IP) []string {
	var out []string
	for _, ns := range rc.nameservers {
		if ip := net.ParseIP(ns); ip != nil && !ip.Equal(self) {
			out = append(out, net.JoinHostPort(ns, "53"))
		}
	}
	return out
}

// podResolvConf is a Pod's /etc/resolv.conf as the kubelet builds it:
//   - ClusterFirst (the default, and ClusterFirstWithHostNet for a Pod without host
//     network): the cluster nameserver, the search list <ns>.svc.<domain> svc.<domain>
//     <domain> followed by the host's, and options ndots:5;
//   - Default: the host's nameservers, search list and options;
//   - None: nothing but the Pod's dnsConfig;
//
// then the Pod's dnsConfig: nameservers and searches appended (duplicates dropped), options
// merged by name (the Pod's win). At most 3 nameservers and 32 search domains are kept.
func podResolvConf(pod *corev1.Pod, host resolvConf, nameserver, domain string) string {
	var rc resolvConf
	switch pod.Spec.DNSPolicy {
	case corev1.DNSNone:
	case corev1.DNSDefault:
		rc = resolvConf{
			nameservers: slices.Clone(host.nameservers),
			searches:    slices.Clone(host.searches),
			options:     slices.Clone(host.options),
		}
	default: // ClusterFirst, ClusterFirstWithHostNet, unset
		rc = resolvConf{
			nameservers: []string{nameserver},
			searches:    append([]string{pod.Namespace + ".svc." + domain, "svc." + domain, domain}, host.searches...),
			options:     []string{"ndots:5"},
		}
	}
	if c := pod.Spec.DNSConfig; c != nil {
		rc.nameservers = append(rc.nameservers, c.Nameservers...)
		rc.searches = append(rc.searches, c.Searches...)
		for _, o := range c.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			rc.options = append(rc.options, opt)
		}
	}
	rc.nameservers = dedup(rc.nameservers)
	rc.searches = dedup(rc.searches)
	if len(rc.nameservers) > 3 {
		rc.nameservers = rc.nameservers[:3]
	}
	if len(rc.searches) > 32 {
		rc.searches = rc.searches[:32]
	}
	// Options by name, the later value winning, in the order the names first appear.
	var names []string
	values := map[string]string{}
	for _, o := range rc.options {
		name, value, _ := strings.Cut(o, ":")
		if _, ok := values[name]; !ok {
			names = append(names, name)
		}
		values[name] = value
	}
	var b strings.Builder
	if len(rc.searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(rc.searches, " "))
	}
	for _, ns := range rc.nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", ns)
	}
	if len(names) > 0 {
		var opts []string
		for _, n := range names {
			if values[n] != "" {
				opts = append(opts, n+":"+values[n])
			} else {
				opts = append(opts, n)
			}
		}
		fmt.Fprintf(&b, "options %s\n", strings.Join(opts, " "))
	}
	return b.String()
}

func dedup(in []string) []string {
	var out []string
	for _, s := range in {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}
