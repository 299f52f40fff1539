package main

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// udpEcho answers every datagram with name; it runs until the test ends.
func udpEcho(t *testing.T, name string) netip.AddrPort {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65535)
		for {
			_, peer, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort([]byte(name), peer)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// ask sends one datagram from c to addr and returns the answer ("" if none in a second).
func ask(t *testing.T, c *net.UDPConn, addr netip.AddrPort) string {
	t.Helper()
	if _, err := c.WriteToUDPAddrPort([]byte("ping"), addr); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 65535)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		return ""
	}
	if from != addr {
		t.Fatalf("answer from %s, not from the forwarder's %s", from, addr)
	}
	return string(buf[:n])
}

func client(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestUDPForwarderSessions(t *testing.T) {
	a, b := udpEcho(t, "a"), udpEcho(t, "b")
	p := newUDPProxy()
	t.Cleanup(p.stop)
	// A port of its own: bind :0 first, then serve there.
	probe, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	bind := probe.LocalAddr().(*net.UDPAddr).AddrPort()
	probe.Close()
	name := udpFrontendName("default", "dns", 53)
	p.apply(map[string]*udpFrontend{name: {name: name, service: "default/dns", bind: bind, want: []netip.AddrPort{a, b}}})
	if !p.serving(name) {
		t.Fatalf("not serving: %v", p.err(name))
	}

	// One client stays on one endpoint; clients are spread round-robin.
	one := client(t)
	first := ask(t, one, bind)
	for i := 0; i < 4; i++ {
		if got := ask(t, one, bind); got != first {
			t.Fatalf("a client's datagram %d went to %q, its session is on %q", i, got, first)
		}
	}
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		seen[ask(t, client(t), bind)]++
	}
	if seen["a"] != 3 || seen["b"] != 3 {
		t.Fatalf("six clients over two endpoints: %v", seen)
	}

	// The session's endpoint leaves: the next datagram goes to the other one.
	other := "a"
	if first == "a" {
		other = "b"
	}
	keep := map[string]netip.AddrPort{"a": a, "b": b}[other]
	p.apply(map[string]*udpFrontend{name: {name: name, service: "default/dns", bind: bind, want: []netip.AddrPort{keep}}})
	if got := ask(t, one, bind); got != other {
		t.Fatalf("after its endpoint left, the client got %q, want %q", got, other)
	}

	// No endpoints: no answer; the port is still served.
	p.apply(map[string]*udpFrontend{name: {name: name, service: "default/dns", bind: bind}})
	if got := ask(t, client(t), bind); got != "" {
		t.Fatalf("no endpoints, yet %q answered", got)
	}

	// Removed: the socket is closed (the port can be bound again).
	p.apply(nil)
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(bind))
	if err != nil {
		t.Fatalf("port not released: %v", err)
	}
	c.Close()
}

func TestUDPForwarderPortInUse(t *testing.T) {
	held, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	bind := held.LocalAddr().(*net.UDPAddr).AddrPort()
	p := newUDPProxy()
	defer p.stop()
	name := udpFrontendName("default", "busy", 53)
	p.apply(map[string]*udpFrontend{name: {name: name, bind: bind}})
	if p.serving(name) || p.err(name) == nil {
		t.Fatal("a UDP port another socket holds was reported served")
	}
}
