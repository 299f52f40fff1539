package main

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// The node's bridge keeps its own address whatever ports come and go. Without a fixed address
// Linux would give the bridge the lowest address among its ports, and removing that port would
// move the node's MAC under every other Pod (see newPodNetwork).
func TestBridgeKeepsItsAddress(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a bridge, veths and network namespaces")
	}
	bridge := fmt.Sprintf("ghtb%d", os.Getpid()%100000)
	n, err := newPodNetwork(bridge, "10.251.0.0/24", fmt.Sprintf("ghtn%d-", os.Getpid()%100000))
	if err != nil {
		t.Fatal(err)
	}
	defer n.teardown()
	want := bridgeMAC(bridge)
	check := func(when string) {
		t.Helper()
		ifc, err := net.InterfaceByName(bridge)
		if err != nil {
			t.Fatal(err)
		}
		if got := ifc.HardwareAddr.String(); got != want {
			t.Fatalf("%s: bridge address %s, want %s", when, got, want)
		}
	}
	check("created")
	uids := []string{"pod-a", "pod-b", "pod-c"}
	for _, uid := range uids {
		addr, err := n.allocate()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.attach(uid, addr); err != nil {
			t.Fatal(err)
		}
		defer n.detach(uid)
	}
	// The first Pod's veth gets the lowest address there can be, so a bridge that follows its
	// ports would take it and then lose it.
	_, veth := n.names(uids[0])
	if err := ip("link", "set", veth, "address", "02:00:00:00:00:01"); err != nil {
		t.Fatal(err)
	}
	check("pods attached")
	for _, uid := range uids {
		n.detach(uid)
		check("after detaching " + uid)
	}
}

func TestBridgeMACIsLocalUnicastAndPerBridge(t *testing.T) {
	a, err := net.ParseMAC(bridgeMAC("ghnode0"))
	if err != nil {
		t.Fatal(err)
	}
	if a[0]&0x01 != 0 || a[0]&0x02 == 0 {
		t.Fatalf("%s is not a locally administered unicast address", a)
	}
	if bridgeMAC("ghnode0") == bridgeMAC("ghnode1") {
		t.Fatal("two bridges got the same address")
	}
}

// Addresses go round the range: a released address is not the next one handed out.
func TestAllocateGoesRoundTheRange(t *testing.T) {
	_, ipnet, _ := net.ParseCIDR("10.252.0.0/29") // offsets 2..6 are Pod addresses
	n := &podNetwork{cidr: ipnet, prefix: 29, used: map[uint32]bool{}}
	take := func() string {
		t.Helper()
		a, err := n.allocate()
		if err != nil {
			t.Fatal(err)
		}
		return a.String()
	}
	if a, b := take(), take(); a != "10.252.0.2" || b != "10.252.0.3" {
		t.Fatalf("first addresses %s, %s", a, b)
	}
	n.release(net.ParseIP("10.252.0.2"))
	if got := take(); got != "10.252.0.4" {
		t.Fatalf("after releasing .2, got %s, want .4 (not the address just released)", got)
	}
	take() // .5
	take() // .6
	if got := take(); got != "10.252.0.2" {
		t.Fatalf("wrapped to %s, want the one free address .2", got)
	}
	if _, err := n.allocate(); err == nil {
		t.Fatal("a full range gave out an address")
	}
}
