package main

import (
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func testDNS(t *testing.T) *dnsServer {
	t.Helper()
	headless := svc("db", "pg", corev1.ClusterIPNone, port("", 5432, ""))
	notReady := svc("db", "pg-all", corev1.ClusterIPNone, port("", 5432, ""))
	notReady.Spec.PublishNotReadyAddresses = true
	ext := svc("default", "ext", "")
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	alias := svc("default", "alias", "")
	alias.Spec.Type, alias.Spec.ExternalName = corev1.ServiceTypeExternalName, "web.default.svc.cluster.local"
	view := newView(t,
		kubernetesService(),
		svc("default", "web", "10.96.0.20", port("http", 80, corev1.ProtocolTCP)),
		headless, notReady, ext, alias,
		slice("db", "pg", "pg-a", "", 5432, corev1.ProtocolTCP, "10.245.7.5@pg-0", "10.245.7.4@pg-1", "10.245.7.6!@pg-2"),
		slice("db", "pg-all", "pg-all-a", "", 5432, corev1.ProtocolTCP, "10.245.7.5", "10.245.7.6!"),
	)
	return &dnsServer{zone: "cluster.local.", view: view}
}

func query(d *dnsServer, name string, qtype uint16) (*dns.Msg, bool) {
	r := new(dns.Msg)
	r.SetQuestion(name, qtype)
	return d.answer(r)
}

// summary is "RCODE rr; rr; ..." with each record in its presentation form minus the TTL
// and class.
func summary(m *dns.Msg) string {
	parts := []string{dns.RcodeToString[m.Rcode]}
	for _, rr := range m.Answer {
		f := strings.Fields(rr.String())
		parts = append(parts, strings.Join(append([]string{f[0]}, f[3:]...), " "))
	}
	return strings.Join(parts, "; ")
}

func TestDNSAnswers(t *testing.T) {
	d := testDNS(t)
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"web.default.svc.cluster.local.", dns.TypeA, "NOERROR; web.default.svc.cluster.local. A 10.96.0.20"},
		{"WEB.Default.svc.cluster.local.", dns.TypeA, "NOERROR; WEB.Default.svc.cluster.local. A 10.96.0.20"},
		{"kubernetes.default.svc.cluster.local.", dns.TypeA, "NOERROR; kubernetes.default.svc.cluster.local. A 10.96.0.1"},
		{"web.default.svc.cluster.local.", dns.TypeAAAA, "NOERROR"},
		{"web.default.svc.cluster.local.", dns.TypeTXT, "NOERROR"},
		{"pg.db.svc.cluster.local.", dns.TypeA, "NOERROR; pg.db.svc.cluster.local. A 10.245.7.4; pg.db.svc.cluster.local. A 10.245.7.5"},
		{"pg-all.db.svc.cluster.local.", dns.TypeA, "NOERROR; pg-all.db.svc.cluster.local. A 10.245.7.5; pg-all.db.svc.cluster.local. A 10.245.7.6"},
		{"pg-1.pg.db.svc.cluster.local.", dns.TypeA, "NOERROR; pg-1.pg.db.svc.cluster.local. A 10.245.7.4"},
		{"pg-2.pg.db.svc.cluster.local.", dns.TypeA, "NXDOMAIN"}, // not ready
		{"pg-9.pg.db.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"x.web.default.svc.cluster.local.", dns.TypeA, "NXDOMAIN"}, // not headless
		{"ext.default.svc.cluster.local.", dns.TypeA, "NOERROR; ext.default.svc.cluster.local. CNAME example.com."},
		{"alias.default.svc.cluster.local.", dns.TypeA, "NOERROR; alias.default.svc.cluster.local. CNAME web.default.svc.cluster.local.; web.default.svc.cluster.local. A 10.96.0.20"},
		{"nope.default.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"web.nope.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"default.svc.cluster.local.", dns.TypeA, "NOERROR"},
		{"nope.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"svc.cluster.local.", dns.TypeA, "NOERROR"},
		{"cluster.local.", dns.TypeA, "NOERROR"},
		{"cluster.local.", dns.TypeSOA, "NOERROR; cluster.local. SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5"},
		{"web.default.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"1-2-3-4.default.pod.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"a.b.web.default.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		// What a resolver with the search list tries for `web` from namespace db.
		{"web.db.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"web.svc.cluster.local.", dns.TypeA, "NXDOMAIN"},
		{"web.cluster.local.", dns.TypeA, "NXDOMAIN"},
	} {
		m, forward := query(d, tc.name, tc.qtype)
		if forward {
			t.Errorf("%s %s: forwarded", tc.name, dns.TypeToString[tc.qtype])
			continue
		}
		if got := summary(m); got != tc.want {
			t.Errorf("%s %s: got %q, want %q", tc.name, dns.TypeToString[tc.qtype], got, tc.want)
		}
		if !m.Authoritative {
			t.Errorf("%s: not authoritative", tc.name)
		}
		if len(m.Answer) == 0 && (len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA) {
			t.Errorf("%s: a negative answer without the SOA: %v", tc.name, m.Ns)
		}
		for _, rr := range m.Answer {
			if rr.Header().Ttl != dnsTTL {
				t.Errorf("%s: TTL %d", tc.name, rr.Header().Ttl)
			}
		}
	}
	for _, name := range []string{"example.com.", "local.", "xcluster.local."} {
		if _, forward := query(d, name, dns.TypeA); !forward {
			t.Errorf("%s not forwarded", name)
		}
	}
	if got := d.externalTarget(must(query(d, "ext.default.svc.cluster.local.", dns.TypeA))); got != "example.com." {
		t.Errorf("external target %q", got)
	}
	if got := d.externalTarget(must(query(d, "alias.default.svc.cluster.local.", dns.TypeA))); got != "" {
		t.Errorf("cluster alias has external target %q", got)
	}
}

func must(m *dns.Msg, _ bool) *dns.Msg { return m }

// Over real sockets: UDP and TCP on a loopback address, a large headless answer truncated for
// UDP and complete over TCP, and a name outside the cluster sent to an upstream.
func TestDNSServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("binding port 53 needs root")
	}
	var eps []string
	for i := 1; i <= 60; i++ {
		eps = append(eps, "10.245.8."+strconv.Itoa(i))
	}
	big := newView(t, svc("db", "many", corev1.ClusterIPNone, port("", 1, "")), slice("db", "many", "many-a", "", 1, corev1.ProtocolTCP, eps...),
		svc("default", "web", "10.96.0.20", port("", 80, "")))

	// The upstream: another instance answering its own zone (example.), on another address.
	up, err := newDNSServer(net.ParseIP("127.83.0.2"), "example", nil)
	if err != nil {
		t.Skipf("cannot bind 127.83.0.2:53: %v", err)
	}
	defer up.shutdown()
	up.serve(newView(t, svc("default", "up", "10.1.2.3", port("", 80, ""))))
	d2, err := newDNSServer(net.ParseIP("127.83.0.1"), "cluster.local", []string{"127.83.0.2:53"})
	if err != nil {
		t.Skipf("cannot bind 127.83.0.1:53: %v", err)
	}
	defer d2.shutdown()
	d2.serve(big)

	ask := func(proto, name string) *dns.Msg {
		t.Helper()
		c := &dns.Client{Net: proto}
		r := new(dns.Msg)
		r.SetQuestion(name, dns.TypeA)
		m, _, err := c.Exchange(r, "127.83.0.1:53")
		if err != nil {
			t.Fatalf("%s %s: %v", proto, name, err)
		}
		return m
	}
	if m := ask("udp", "web.default.svc.cluster.local."); summary(m) != "NOERROR; web.default.svc.cluster.local. A 10.96.0.20" {
		t.Errorf("udp: %s", summary(m))
	}
	if m := ask("tcp", "web.default.svc.cluster.local."); summary(m) != "NOERROR; web.default.svc.cluster.local. A 10.96.0.20" {
		t.Errorf("tcp: %s", summary(m))
	}
	if m := ask("udp", "many.db.svc.cluster.local."); !m.Truncated || len(m.Answer) >= 60 {
		t.Errorf("udp, 60 records: truncated %v with %d", m.Truncated, len(m.Answer))
	}
	if m := ask("tcp", "many.db.svc.cluster.local."); m.Truncated || len(m.Answer) != 60 {
		t.Errorf("tcp, 60 records: truncated %v with %d", m.Truncated, len(m.Answer))
	}
	for _, proto := range []string{"udp", "tcp"} {
		if m := ask(proto, "up.default.svc.example."); summary(m) != "NOERROR; up.default.svc.example. A 10.1.2.3" {
			t.Errorf("forwarded over %s: %s", proto, summary(m))
		}
	}
	// An upstream that is not there: SERVFAIL; no upstream at all: REFUSED.
	for _, tc := range []struct {
		addr      string
		upstreams []string
		want      int
	}{
		{"127.83.0.3", []string{"127.83.0.9:53"}, dns.RcodeServerFailure},
		{"127.83.0.4", nil, dns.RcodeRefused},
	} {
		s, err := newDNSServer(net.ParseIP(tc.addr), "cluster.local", tc.upstreams)
		if err != nil {
			t.Fatal(err)
		}
		s.serve(big)
		r := new(dns.Msg)
		r.SetQuestion("example.org.", dns.TypeA)
		m, _, err := (&dns.Client{}).Exchange(r, tc.addr+":53")
		s.shutdown()
		if err != nil || m.Rcode != tc.want {
			t.Errorf("upstreams %v: %v %v, want %s", tc.upstreams, err, m, dns.RcodeToString[tc.want])
		}
	}
}

func TestResolvConf(t *testing.T) {
	host := parseResolvConf("# comment\nnameserver 10.255.255.53\nnameserver 10.255.255.54 ; x\nsearch corp.example. .\noptions edns0 ndots:2\n")
	if !slices.Equal(host.nameservers, []string{"10.255.255.53", "10.255.255.54"}) || !slices.Equal(host.searches, []string{"corp.example"}) ||
		!slices.Equal(host.options, []string{"edns0", "ndots:2"}) {
		t.Fatalf("parsed %+v", host)
	}
	if got := upstreamsOf(host, net.ParseIP("10.255.255.54")); !slices.Equal(got, []string{"10.255.255.53:53"}) {
		t.Errorf("upstreams %v", got)
	}
	pod := func(policy corev1.DNSPolicy, cfg *corev1.PodDNSConfig) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team"}, Spec: corev1.PodSpec{DNSPolicy: policy, DNSConfig: cfg}}
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"unset is ClusterFirst", pod("", nil),
			"search team.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.245.7.1\noptions ndots:5\n"},
		{"ClusterFirstWithHostNet without host network", pod(corev1.DNSClusterFirstWithHostNet, nil),
			"search team.svc.cluster.local svc.cluster.local cluster.local corp.example\nnameserver 10.245.7.1\noptions ndots:5\n"},
		{"ClusterFirst with dnsConfig", pod(corev1.DNSClusterFirst, &corev1.PodDNSConfig{
			Nameservers: []string{"10.245.7.1", "1.1.1.1"},
			Searches:    []string{"extra.example", "svc.cluster.local"},
			Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("2")}, {Name: "single-request-reopen"}},
		}), "search team.svc.cluster.local svc.cluster.local cluster.local corp.example extra.example\nnameserver 10.245.7.1\nnameserver 1.1.1.1\noptions ndots:2 single-request-reopen\n"},
		{"Default: the host's", pod(corev1.DNSDefault, nil),
			"search corp.example\nnameserver 10.255.255.53\nnameserver 10.255.255.54\noptions edns0 ndots:2\n"},
		{"Default with dnsConfig, at most 3 nameservers", pod(corev1.DNSDefault, &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1", "8.8.8.8"}, Options: []corev1.PodDNSConfigOption{{Name: "edns0"}, {Name: "timeout", Value: ptr("1")}},
		}), "search corp.example\nnameserver 10.255.255.53\nnameserver 10.255.255.54\nnameserver 1.1.1.1\noptions edns0 ndots:2 timeout:1\n"},
		{"None: only dnsConfig", pod(corev1.DNSNone, &corev1.PodDNSConfig{
			Nameservers: []string{"192.0.2.53"}, Searches: []string{"a.example"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}},
		}), "search a.example\nnameserver 192.0.2.53\noptions ndots:1\n"},
		{"None without dnsConfig", pod(corev1.DNSNone, nil), ""},
	} {
		if got := podResolvConf(tc.pod, host, "10.245.7.1", "cluster.local"); got != tc.want {
			t.Errorf("%s:\ngot\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}
