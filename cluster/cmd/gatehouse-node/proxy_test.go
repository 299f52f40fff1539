package main

import (
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func testPorts(t *testing.T) []proxyPort {
	t.Helper()
	headless := svc("default", "db", corev1.ClusterIPNone, port("", 5432, ""))
	external := svc("default", "ext", "")
	external.Spec.Type, external.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	view := newView(t,
		kubernetesService(),
		svc("default", "web", "10.96.0.20", port("http", 80, corev1.ProtocolTCP), port("dns", 53, corev1.ProtocolUDP), port("sctp", 9, corev1.ProtocolSCTP)),
		slice("default", "web", "web-a", "http", 8080, corev1.ProtocolTCP, "10.245.7.3", "10.245.7.2", "10.245.7.9!"),
		slice("default", "web", "web-b", "dns", 5353, corev1.ProtocolUDP, "10.245.7.2"),
		svc("default", "empty", "10.96.0.30", port("", 80, ""), port("dns", 53, corev1.ProtocolUDP)),
		svc("other", "outside", "10.96.0.40", port("", 443, "")),
		slice("other", "outside", "outside-a", "", 8443, corev1.ProtocolTCP, "10.252.1.2"),
		headless, external,
	)
	return proxyPorts(view.all(), view.slicesOf, netip.MustParseAddrPort("127.0.0.1:23456"))
}

func TestProxyPorts(t *testing.T) {
	var got []string
	for _, p := range testPorts(t) {
		var eps []string
		for _, e := range p.endpoints {
			eps = append(eps, e.String())
		}
		got = append(got, p.service+" "+p.portLabel()+" "+p.clusterIP.String()+" -> "+strings.Join(eps, ","))
	}
	want := []string{
		"default/empty 80/tcp 10.96.0.30 -> ",
		"default/empty dns 10.96.0.30 -> ",
		"default/kubernetes https 10.96.0.1 -> 127.0.0.1:23456",
		"default/web http 10.96.0.20 -> 10.245.7.2:8080,10.245.7.3:8080",
		"default/web dns 10.96.0.20 -> 10.245.7.2:5353",
		"other/outside 443/tcp 10.96.0.40 -> 10.252.1.2:8443",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestRenderRules(t *testing.T) {
	rs := ruleSet{table: proxyTable("ghn7"), bridge: "ghn7", podCIDR: netip.MustParsePrefix("10.245.7.0/24"), brNetfilter: true, ports: testPorts(t)}
	out := renderRules(rs)
	for _, line := range []string{
		"table ip gatehouse-node-ghn7 {}\ndelete table ip gatehouse-node-ghn7\ntable ip gatehouse-node-ghn7 {\n",
		"\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tiifname \"ghn7\" jump services\n",
		"\t\tip daddr 10.96.0.1 tcp dport 443 jump svc/default/kubernetes/443/tcp comment \"default/kubernetes:https\"\n",
		"\tchain ep/default/kubernetes/443/tcp/127.0.0.1/23456 {\n\t\tmeta l4proto tcp dnat to 127.0.0.1:23456\n",
		"\t\tip daddr 10.96.0.20 tcp dport 80 jump svc/default/web/80/tcp comment \"default/web:http\"\n",
		"\tchain svc/default/web/80/tcp {\n\t\tnumgen random mod 2 vmap { 0 : jump ep/default/web/80/tcp/10.245.7.2/8080, 1 : jump ep/default/web/80/tcp/10.245.7.3/8080 }\n",
		"\tchain ep/default/web/80/tcp/10.245.7.3/8080 {\n\t\tmeta l4proto tcp dnat to 10.245.7.3:8080\n",
		"\t\tip daddr 10.96.0.20 udp dport 53 jump svc/default/web/53/udp comment \"default/web:dns\"\n",
		"\tchain svc/default/web/53/udp {\n\t\tjump ep/default/web/53/udp/10.245.7.2/5353\n",
		"\t\tmeta l4proto udp dnat to 10.245.7.2:5353\n",
		"\t\toifname \"ghn7\" ct status dnat ip saddr . ip daddr { 10.245.7.2 . 10.245.7.2, 10.245.7.3 . 10.245.7.3 } masquerade",
		"\t\toifname != \"ghn7\" ct status dnat ip saddr 10.245.7.0/24 masquerade",
		"\tchain no-endpoints {\n\t\ttype filter hook prerouting priority filter; policy accept;\n\t\tiifname \"ghn7\" ip daddr 10.96.0.30 tcp dport 80 reject with tcp reset comment \"default/empty:80/tcp has no endpoints\"\n",
		"\t\tiifname \"ghn7\" ip daddr 10.96.0.30 udp dport 53 reject comment \"default/empty:dns has no endpoints\"\n",
		"\t\tiifname \"ghn7\" oifname != \"ghn7\" ct status & dnat == 0 reject with icmp type host-unreachable",
		"\t\tiifname \"ghn7\" ip daddr 127.0.0.0/8 ct status & dnat == 0 drop",
	} {
		if !strings.Contains(out, line) {
			t.Errorf("rules lack %q", line)
		}
	}
	for _, absent := range []string{"10.96.0.30 tcp dport 80 jump", "sctp", "5432", "ext"} {
		if strings.Contains(out, absent) {
			t.Errorf("rules contain %q", absent)
		}
	}
	if t.Failed() {
		t.Log(out)
	}

	// Without br_netfilter every DNATed Pod-to-Pod connection is masqueraded.
	rs.brNetfilter = false
	if out := renderRules(rs); !strings.Contains(out, "oifname \"ghn7\" ct status dnat ip saddr 10.245.7.0/24 masquerade") || strings.Contains(out, "ip saddr . ip daddr") {
		t.Errorf("without br_netfilter:\n%s", out)
	}

	// Nothing but the fixed chains when there are no Services.
	rs.ports = nil
	empty := renderRules(rs)
	if !strings.Contains(empty, "chain services {\n\t}") || strings.Contains(empty, "ip saddr . ip daddr") {
		t.Errorf("no Services:\n%s", empty)
	}

	// The kernel accepts them (nft --check: a transaction that is never committed).
	if os.Geteuid() != 0 {
		t.Skip("nft --check needs root")
	}
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("no nft")
	}
	for _, script := range []string{out, empty} {
		cmd := exec.Command("nft", "--check", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("nft --check: %v: %s\n%s", err, b, script)
		}
	}
}

// The kubeconfig's server is an IPv4 address nft can DNAT to: net.ResolveTCPAddr gives a
// 16-byte IP, which must not end up as ::ffff:127.0.0.1 in the rules.
func TestAPIServerAddr(t *testing.T) {
	for server, want := range map[string]string{
		"https://127.0.0.1:23456": "127.0.0.1:23456",
		"https://localhost:6443":  "127.0.0.1:6443",
		"https://127.0.0.1":       "127.0.0.1:443",
	} {
		got, err := apiServerAddr(server)
		if err != nil || got.String() != want || !got.Addr().Is4() {
			t.Errorf("apiServerAddr(%q) = %v, %v; want %s", server, got, err, want)
		}
	}
	if _, err := apiServerAddr("not a url"); err == nil {
		t.Error("apiServerAddr accepted a non-URL")
	}
}
