package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

func TestAllocator(t *testing.T) {
	a, err := newAllocator(netip.MustParsePrefix("127.200.0.0/30"))
	if err != nil {
		t.Fatal(err)
	}
	// /30: .1 and .2 usable (network and broadcast left out).
	if a.contains(netip.MustParseAddr("127.200.0.0")) || a.contains(netip.MustParseAddr("127.200.0.3")) {
		t.Fatal("network or broadcast address handed out")
	}
	ip, ok := a.next("ns/a")
	if !ok || ip.String() != "127.200.0.1" {
		t.Fatalf("first = %v %v", ip, ok)
	}
	if again, _ := a.next("ns/a"); again != ip {
		t.Fatal("next is not stable for a key that has an address")
	}
	if a.claim("ns/b", ip) {
		t.Fatal("claimed an address in use")
	}
	if !a.claim("ns/b", netip.MustParseAddr("127.200.0.2")) {
		t.Fatal("could not claim a free address")
	}
	if _, ok := a.next("ns/c"); ok {
		t.Fatal("allocated from a full range")
	}
	if h, _ := a.holder(netip.MustParseAddr("127.200.0.2")); h != "ns/b" {
		t.Fatalf("holder = %q", h)
	}
	a.release("ns/a")
	if ip, ok := a.next("ns/c"); !ok || ip.String() != "127.200.0.1" {
		t.Fatalf("after release: %v %v", ip, ok)
	}
	if a.claim("ns/d", netip.MustParseAddr("127.201.0.1")) {
		t.Fatal("claimed an address out of range")
	}
	if _, err := newAllocator(netip.MustParsePrefix("10.0.0.7/32")); err != nil {
		t.Fatalf("/32: %v", err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestEndpointsFor(t *testing.T) {
	sp := corev1.ServicePort{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}
	ep := func(ip string, ready, serving, terminating *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	}
	slice := &discoveryv1.EndpointSlice{
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr("metrics"), Port: ptr(int32(9090))},
			{Name: ptr("http"), Port: ptr(int32(8080)), Protocol: ptr(corev1.ProtocolTCP)},
		},
		Endpoints: []discoveryv1.Endpoint{
			ep("10.0.0.3", nil, nil, nil),       // ready unset: ready
			ep("10.0.0.2", ptr(true), nil, nil), // ready
			ep("10.0.0.4", ptr(false), ptr(true), ptr(true)),
			ep("10.0.0.5", ptr(false), nil, nil),
		},
	}
	dup := slice.DeepCopy()
	dup.Endpoints = dup.Endpoints[:1]
	other := slice.DeepCopy()
	other.Ports = []discoveryv1.EndpointPort{{Name: ptr("other"), Port: ptr(int32(1))}}
	v6 := slice.DeepCopy()
	v6.AddressType = discoveryv1.AddressTypeIPv6
	v6.Endpoints = []discoveryv1.Endpoint{ep("fd00::1", nil, nil, nil)}

	got := endpointsFor(sp, discoveryv1.AddressTypeIPv4, []*discoveryv1.EndpointSlice{slice, dup, other, v6})
	want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:8080"), netip.MustParseAddrPort("10.0.0.3:8080")}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// No ready endpoint left: the serving terminating ones (kube-proxy's fallback).
	s2 := slice.DeepCopy()
	s2.Endpoints = s2.Endpoints[2:]
	got = endpointsFor(sp, discoveryv1.AddressTypeIPv4, []*discoveryv1.EndpointSlice{s2})
	if !slices.Equal(got, []netip.AddrPort{netip.MustParseAddrPort("10.0.0.4:8080")}) {
		t.Fatalf("fallback: got %v", got)
	}
	// An unnamed Service port matches the unnamed slice port only.
	unnamed := corev1.ServicePort{Port: 80, Protocol: corev1.ProtocolTCP}
	if got := endpointsFor(unnamed, discoveryv1.AddressTypeIPv4, []*discoveryv1.EndpointSlice{slice}); len(got) != 0 {
		t.Fatalf("unnamed port matched a named one: %v", got)
	}
}

func aps(ss ...string) []netip.AddrPort {
	out := make([]netip.AddrPort, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddrPort(s)
	}
	return out
}

func TestPlaceKeepsSlots(t *testing.T) {
	s := planSlots(nil, aps("10.0.0.1:80", "10.0.0.2:80"))
	if len(s) != 8 || s[0].addr.String() != "10.0.0.1:80" || s[1].addr.String() != "10.0.0.2:80" || !s[0].enabled {
		t.Fatalf("initial: %+v", s)
	}
	// .1 leaves, .3 arrives: .2 stays in slot 2, .1 stays (disabled) in slot 1, .3 takes a
	// never-used slot.
	s2 := planSlots(s, aps("10.0.0.2:80", "10.0.0.3:80"))
	if len(s2) != 8 || s2[0].enabled || s2[0].addr.String() != "10.0.0.1:80" || !s2[1].enabled || s2[2].addr.String() != "10.0.0.3:80" || !s2[2].enabled {
		t.Fatalf("after change: %+v", s2)
	}
	cmds := runtimeCommands("ns.svc.80", s, s2)
	want := []string{"set server ns.svc.80/ep3 addr 10.0.0.3 port 80", "set server ns.svc.80/ep3 state ready", "set server ns.svc.80/ep1 state maint"}
	if !slices.Equal(cmds, want) {
		t.Fatalf("commands %q, want %q", cmds, want)
	}
	// .1 comes back: same slot, just enabled.
	s3 := planSlots(s2, aps("10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"))
	if c := runtimeCommands("b", s2, s3); !slices.Equal(c, []string{"set server b/ep1 state ready"}) {
		t.Fatalf("re-ready: %q", c)
	}
	// Nine endpoints do not fit in eight slots: grow to 32 (a reload).
	many := aps("10.0.1.1:80", "10.0.1.2:80", "10.0.1.3:80", "10.0.1.4:80", "10.0.1.5:80", "10.0.1.6:80", "10.0.1.7:80", "10.0.1.8:80", "10.0.1.9:80")
	if _, ok := place(s3, many); ok {
		t.Fatal("nine endpoints fit in eight slots")
	}
	if g := planSlots(s3, many); len(g) != 32 {
		t.Fatalf("grown to %d slots", len(g))
	}
}

func TestParseShowProc(t *testing.T) {
	out := `#<PID>          <type>          <reloads>       <uptime>        <version>
30820           master          4 [failed: 1]   0d00h11m03s     2.6.12-1+deb12u4
# workers
21175           worker          1               0d00h00m11s     2.6.12-1+deb12u4
# old workers
21043           worker          2               0d00h00m20s     2.6.12-1+deb12u4
# programs
`
	p, err := parseShowProc(out)
	if err != nil {
		t.Fatal(err)
	}
	if p.reloads != 4 || p.failed != 1 || !slices.Equal(p.workers, []int{21175}) || !slices.Equal(p.old, []int{21043}) {
		t.Fatalf("%+v", p)
	}
	if _, err := parseShowProc("Unknown command\n"); err == nil {
		t.Fatal("garbage parsed")
	}
}

// The rendered configuration is one haproxy accepts (skipped without haproxy).
func TestRenderConfigChecks(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Skip("no haproxy")
	}
	fes := map[string]*frontend{}
	for i, f := range []*frontend{
		{name: "default.web.80", service: "default/web", comment: `80/TCP ("http")`, bind: netip.MustParseAddrPort("127.200.0.1:80"), balance: "roundrobin", want: aps("10.0.0.1:8080", "10.0.0.2:8080")},
		{name: "default.web.443", service: "default/web", comment: "443/TCP", bind: netip.MustParseAddrPort("127.200.0.1:443"), balance: "source", want: aps("10.0.0.1:8443")},
		{name: "default.empty.81", service: "default/empty", comment: "81/TCP", bind: netip.MustParseAddrPort("127.200.0.2:81"), balance: "roundrobin"},
	} {
		f.slots = planSlots(nil, f.want)
		if i == 0 { // a disabled slot with an address between used ones
			f.slots = planSlots(f.slots, aps("10.0.0.2:8080", "[fd00::5]:8080"))
		}
		fes[f.name] = f
	}
	dir := t.TempDir()
	cfg := renderConfig(filepath.Join(dir, "haproxy.sock"), fes)
	for _, want := range []string{"server ep1 10.0.0.1:8080 disabled", "server ep2 10.0.0.2:8080\n", "server ep3 ipv6@fd00::5:8080\n", "server-template ep 4-8 0.0.0.0:1 disabled", "balance source"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("configuration lacks %q:\n%s", want, cfg)
		}
	}
	path := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-f", path).CombinedOutput(); err != nil {
		t.Fatalf("haproxy -c: %v\n%s\n%s", err, out, cfg)
	}
}

// listenLow listens on ip at a random free port below the kernel's ephemeral range
// (32768 and up), where client sockets would clash.
func listenLow(t *testing.T, ip string) net.Listener {
	for i := 0; i < 200; i++ {
		port := 20000 + rand.IntN(12768)
		if l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port))); err == nil {
			return l
		}
	}
	t.Fatalf("no free port on %s", ip)
	return nil
}

// freePort is a port below 32768 nothing listens on at ip right now.
func freePort(t *testing.T, ip string) uint16 {
	l := listenLow(t, ip)
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// namedServer accepts connections on 127.0.0.1 and writes name to each.
func namedServer(t *testing.T, name string) netip.AddrPort {
	l := listenLow(t, "127.0.0.1")
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name))
			c.Close()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

func dialRead(addr netip.AddrPort) string {
	c, err := net.DialTimeout("tcp", addr.String(), time.Second)
	if err != nil {
		return "ERR " + err.Error()
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, _ := io.ReadAll(c)
	return string(b)
}

// The haproxy manager against a real haproxy: start, an endpoint change through the runtime
// API (no reload), a new frontend (reload), and a reload haproxy refuses (the address is
// taken after the probe): the previous configuration keeps serving and stays on disk.
func TestHAProxyLifecycle(t *testing.T) {
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Skip("no haproxy")
	}
	h, err := newHAProxy("haproxy", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer h.stop()
	a, b := namedServer(t, "a"), namedServer(t, "b")
	bind1 := netip.AddrPortFrom(netip.MustParseAddr("127.203.0.1"), freePort(t, "127.203.0.1"))
	fe := func(name string, bind netip.AddrPort, eps ...netip.AddrPort) *frontend {
		return &frontend{name: name, service: "t/" + name, comment: "test", bind: bind, balance: "roundrobin", want: eps}
	}
	if err := h.apply(map[string]*frontend{"t.one.1": fe("t.one.1", bind1, a)}); err != nil {
		t.Fatal(err)
	}
	if got := dialRead(bind1); got != "a" {
		t.Fatalf("through haproxy: %q", got)
	}
	if err := h.apply(map[string]*frontend{"t.one.1": fe("t.one.1", bind1, b)}); err != nil {
		t.Fatal(err)
	}
	p, err := h.showProc()
	if err != nil || p.reloads != 0 {
		t.Fatalf("an endpoint change reloaded: %+v %v", p, err)
	}
	if got := dialRead(bind1); got != "b" {
		t.Fatalf("after the runtime change: %q", got)
	}
	bind2 := netip.AddrPortFrom(netip.MustParseAddr("127.203.0.2"), freePort(t, "127.203.0.2"))
	two := map[string]*frontend{"t.one.1": fe("t.one.1", bind1, b), "t.two.2": fe("t.two.2", bind2, a)}
	if err := h.apply(two); err != nil {
		t.Fatal(err)
	}
	if p, _ := h.showProc(); p.reloads != 1 {
		t.Fatalf("a new frontend did not reload once: %+v", p)
	}
	if got := dialRead(bind2); got != "a" {
		t.Fatalf("new frontend: %q", got)
	}
	good, _ := os.ReadFile(h.cfgPath)

	// A third frontend whose address is taken: reload() itself does not probe.
	bind3 := netip.AddrPortFrom(netip.MustParseAddr("127.203.0.3"), freePort(t, "127.203.0.3"))
	hold, err := net.Listen("tcp", bind3.String())
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Close()
	three := map[string]*frontend{"t.one.1": fe("t.one.1", bind1, b), "t.two.2": fe("t.two.2", bind2, a), "t.three.3": fe("t.three.3", bind3, a)}
	for _, f := range three {
		f.slots = planSlots(nil, f.want)
	}
	if err := h.reload(three); err == nil {
		t.Fatal("reload onto a taken address succeeded")
	} else {
		t.Logf("reload refused as expected: %v", err)
	}
	if got := dialRead(bind1); got != "b" {
		t.Fatalf("after the failed reload: %q", got)
	}
	if now, _ := os.ReadFile(h.cfgPath); !bytes.Equal(now, good) {
		t.Fatal("the configuration on disk is not the one that serves")
	}
	if h.serving("t.three.3") || !h.serving("t.two.2") {
		t.Fatal("running set changed by a failed reload")
	}
	// Through apply, the probe leaves the taken address out instead.
	if err := h.apply(three); err != nil {
		t.Fatal(err)
	}
	if h.listenErr["t.three.3"] == nil || h.serving("t.three.3") {
		t.Fatal("taken address not left out")
	}
	exited := h.exited
	h.stop()
	select {
	case <-exited:
	default:
		t.Fatal("haproxy still running after stop")
	}
}
