package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// frontend is one (Service, TCP port): a haproxy frontend on bind and a backend of the
// same name whose server slots carry the port's endpoints.
type frontend struct {
	name    string // "<namespace>.<service>.<port>": both labels are DNS labels, so no '.' in them
	service string // "<namespace>/<service>", for comments and logs
	comment string // the Service port as written, for the configuration's readers
	bind    netip.AddrPort
	balance string           // "roundrobin", or "source" for sessionAffinity: ClientIP
	want    []netip.AddrPort // the endpoints to forward to (sorted)
	slots   []slot           // server slots ep1..epN; see place
}

// slot is one `server epN` of a backend. A slot that has never carried an endpoint has no
// address (0.0.0.0:1 in the configuration) and is disabled; a slot whose endpoint went away
// keeps the address, disabled, so that the same endpoint coming back (not ready -> ready)
// gets the same server again.
type slot struct {
	addr    netip.AddrPort
	enabled bool
}

func frontendName(namespace, name string, port int32) string {
	return fmt.Sprintf("%s.%s.%d", namespace, name, port)
}

// headroom is the number of slots a backend of n endpoints is configured with: twice the
// endpoints (a rolling update briefly has old and new ones side by side), at least 8.
func headroom(n int) int {
	size := 8
	for size < 2*n {
		size *= 2
	}
	return size
}

// place maps the endpoints onto the existing slots without moving any endpoint that already
// has one: a slot whose address is wanted is enabled, one whose address is not is disabled
// (keeping its address), and each new endpoint takes a never-used slot, else the lowest
// disabled one. It reports false if the slots are too few.
func place(prev []slot, want []netip.AddrPort) ([]slot, bool) {
	out := slices.Clone(prev)
	placed := map[netip.AddrPort]bool{}
	wanted := map[netip.AddrPort]bool{}
	for _, w := range want {
		wanted[w] = true
	}
	for i := range out {
		a := out[i].addr
		if a.IsValid() && wanted[a] && !placed[a] {
			out[i].enabled = true
			placed[a] = true
		} else {
			out[i].enabled = false
		}
	}
	for _, w := range want {
		if placed[w] {
			continue
		}
		free := -1
		for i := range out { // never-used slots first
			if !out[i].addr.IsValid() {
				free = i
				break
			}
		}
		if free < 0 {
			for i := range out {
				if !out[i].enabled {
					free = i
					break
				}
			}
		}
		if free < 0 {
			return nil, false
		}
		out[free] = slot{addr: w, enabled: true}
		placed[w] = true
	}
	return out, true
}

// planSlots is place, growing the backend to headroom(len(want)) slots when it is too
// small (a change that needs a reload).
func planSlots(prev []slot, want []netip.AddrPort) []slot {
	if len(prev) == 0 {
		prev = make([]slot, headroom(len(want)))
	}
	if out, ok := place(prev, want); ok {
		return out
	}
	grown := slices.Clone(prev)
	for len(grown) < headroom(len(want)) {
		grown = append(grown, slot{})
	}
	out, _ := place(grown, want) // always fits: headroom(n) >= 2n
	return out
}

// sameShape says whether the running haproxy can take want through the runtime API alone:
// the same frontends on the same addresses with the same balancing, and the same number of
// server slots in every backend.
func sameShape(running, want map[string]*frontend) bool {
	if len(running) != len(want) {
		return false
	}
	for name, w := range want {
		r, ok := running[name]
		if !ok || r.bind != w.bind || r.balance != w.balance || len(r.slots) != len(w.slots) {
			return false
		}
	}
	return true
}

func haproxyAddr(a netip.AddrPort) string {
	if a.Addr().Is4() {
		return a.String()
	}
	return fmt.Sprintf("ipv6@%s:%d", a.Addr(), a.Port())
}

// Health checks: a TCP connect every second; two failures in a row (the second one
// 500 ms after the first) take a server out, one success puts it back. retries with
// `redispatch 1` sends a connection that is refused by a dead endpoint the checks have not
// caught yet to another server. A connect times out after 1 s, one SYN without its
// retransmission: every endpoint is a pod on this host, which answers in microseconds or
// has gone (its network namespace deleted, so the SYN goes unanswered). At 2 s, the
// clients' own timeout in the benchmarks, a connection sent to a pod that had just gone
// failed instead of being redispatched.
const haproxyDefaults = `defaults
    mode tcp
    timeout connect 1s
    timeout client 24h
    timeout server 24h
    timeout client-fin 30s
    timeout server-fin 30s
    timeout check 1s
    retries 2
    option redispatch 1
    default-server check inter 1s fastinter 500ms downinter 1s rise 1 fall 2
`

// renderConfig writes the whole configuration: every frontend with its slots as they are
// now, so that a reload starts the new worker with exactly the running state.
func renderConfig(statsSock string, fes map[string]*frontend) string {
	var b strings.Builder
	b.WriteString("# Written by gatehouse-lb; rewritten on every change of the frontends. Endpoint\n")
	b.WriteString("# changes in between go through the runtime API (see `show servers state`).\n")
	b.WriteString("global\n")
	b.WriteString("    nbthread 1\n")
	fmt.Fprintf(&b, "    stats socket %s mode 600 level admin expose-fd listeners\n", statsSock)
	b.WriteString("    stats timeout 1m\n\n")
	b.WriteString(haproxyDefaults)

	names := make([]string, 0, len(fes))
	for n := range fes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		f := fes[n]
		fmt.Fprintf(&b, "\n# Service %s port %s: %d endpoint(s)\n", f.service, f.comment, len(f.want))
		fmt.Fprintf(&b, "frontend %s\n    bind %s\n    default_backend %s\n\n", f.name, haproxyAddr(f.bind), f.name)
		fmt.Fprintf(&b, "backend %s\n    balance %s\n", f.name, f.balance)
		if f.balance == "source" {
			b.WriteString("    hash-type consistent\n")
		}
		for i := 0; i < len(f.slots); {
			s := f.slots[i]
			if s.addr.IsValid() {
				dis := ""
				if !s.enabled {
					dis = " disabled"
				}
				fmt.Fprintf(&b, "    server ep%d %s%s\n", i+1, haproxyAddr(s.addr), dis)
				i++
				continue
			}
			j := i
			for j+1 < len(f.slots) && !f.slots[j+1].addr.IsValid() {
				j++
			}
			fmt.Fprintf(&b, "    server-template ep %d-%d 0.0.0.0:1 disabled\n", i+1, j+1)
			i = j + 1
		}
	}
	return b.String()
}

// runtimeCommands are the runtime API commands that turn the running slots into the wanted
// ones. Endpoints are added before others are taken out, so that a backend never has no
// server in between. A slot that gets a new address is put in maintenance first (if it
// was serving), re-addressed, then made ready: haproxy never sends a new connection to a
// half-changed server, and connections already established keep their own server
// connection whatever happens to the slot ("maint" does not close them).
func runtimeCommands(backend string, running, want []slot) []string {
	var add, remove []string
	for i := range want {
		srv := fmt.Sprintf("%s/ep%d", backend, i+1)
		r, w := running[i], want[i]
		switch {
		case w.addr != r.addr && w.addr.IsValid():
			if r.enabled {
				add = append(add, "set server "+srv+" state maint")
			}
			add = append(add, fmt.Sprintf("set server %s addr %s port %d", srv, w.addr.Addr(), w.addr.Port()))
			if w.enabled {
				add = append(add, "set server "+srv+" state ready")
			}
		case w.enabled && !r.enabled:
			add = append(add, "set server "+srv+" state ready")
		case !w.enabled && r.enabled:
			remove = append(remove, "set server "+srv+" state maint")
		}
	}
	return append(add, remove...)
}
