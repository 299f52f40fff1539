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
