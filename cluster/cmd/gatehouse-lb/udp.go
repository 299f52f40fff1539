package main

// UDP ports are forwarded by gatehouse-lb itself: haproxy (the community edition) has no UDP
// proxying. The alternative, nftables DNAT from the LoadBalancer address to the endpoints,
// would need conntrack, route_localnet (the addresses are in 127/8 and the endpoints behind a
// bridge: the kernel drops 127/8 sources routed off loopback) and rules in the machine's
// shared netfilter tables that a killed run leaves behind. A forwarder in this process has
// none of that: when it exits, its sockets are gone.
//
// Each (Service, UDP port) is one socket on <ip>:<port>. Datagrams from one client address
// and port form a session with a socket of its own connected to one endpoint (round-robin
// at the session's start), so the endpoint's answers come back to that client from the
// LoadBalancer address. A session ends after udpIdle without a datagram either way, when
// its endpoint leaves the Service, or when the endpoint refuses (ICMP port unreachable); the
// client's next datagram starts a new one. Endpoint changes never touch sessions whose
// endpoint stays.

import (
	"errors"
	"log"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// udpIdle ends sessions that carried nothing either way for this long.
const udpIdle = 60 * time.Second

// maxUDPSessions bounds the sessions of one port; datagrams of new clients beyond it are
// dropped.
const maxUDPSessions = 4096

// udpFrontend is one (Service, UDP port) as the controller wants it.
type udpFrontend struct {
	name    string // "<namespace>.<service>.<port>.udp"
	service string
	bind    netip.AddrPort
	want    []netip.AddrPort // endpoints, sorted
}

func udpFrontendName(namespace, name string, port int32) string {
	return frontendName(namespace, name, port) + ".udp"
}

// udpProxy serves every UDP frontend.
type udpProxy struct {
	mu        sync.Mutex
	running   map[string]*udpForwarder
	listenErr map[string]error
}

func newUDPProxy() *udpProxy {
	return &udpProxy{running: map[string]*udpForwarder{}, listenErr: map[string]error{}}
}

// apply makes the proxy serve want: new frontends are bound (one that cannot be is left
// out, with its error in listenErr), removed ones closed, and the endpoints of the others
// replaced in place.
func (p *udpProxy) apply(want map[string]*udpFrontend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, f := range p.running {
		if w, ok := want[name]; !ok || w.bind != f.bind {
			f.close()
			delete(p.running, name)
			log.Printf("udp %s: stopped", name)
		}
	}
	p.listenErr = map[string]error{}
	for name, w := range want {
		if f, ok := p.running[name]; ok {
			f.setEndpoints(w.want)
			continue
		}
		f, err := listenUDP(w)
		if err != nil {
			p.listenErr[name] = err
			log.Printf("udp %s: cannot listen on %s: %v", name, w.bind, err)
			continue
		}
		p.running[name] = f
		log.Printf("udp %s: forwarding %s (Service %s) to %d endpoint(s)", name, w.bind, w.service, len(w.want))
	}
}

func (p *udpProxy) serving(name string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.running[name]
	return ok
}

func (p *udpProxy) err(name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.listenErr[name]
}

func (p *udpProxy) stop() {
	p.apply(nil)
}

// udpForwarder is one UDP port's socket and sessions.
type udpForwarder struct {
	name      string
	bind      netip.AddrPort
	conn      *net.UDPConn
	endpoints atomic.Pointer[[]netip.AddrPort]
	next      atomic.Uint64

	mu       sync.Mutex
	sessions map[netip.AddrPort]*udpSession
	closed   bool
}

type udpSession struct {
	up       *net.UDPConn
	endpoint netip.AddrPort
	last     atomic.Int64 // unix nanoseconds of the last datagram either way
}

func listenUDP(w *udpFrontend) (*udpForwarder, error) {
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(w.bind))
	if err != nil {
		return nil, err
	}
	f := &udpForwarder{name: w.name, bind: w.bind, conn: conn, sessions: map[netip.AddrPort]*udpSession{}}
	eps := slices.Clone(w.want)
	f.endpoints.Store(&eps)
	go f.serve()
	return f, nil
}

// setEndpoints replaces the endpoints; sessions to endpoints that left end.
func (f *udpForwarder) setEndpoints(want []netip.AddrPort) {
	eps := slices.Clone(want)
	f.endpoints.Store(&eps)
	f.mu.Lock()
	defer f.mu.Unlock()
	for client, s := range f.sessions {
		if !slices.Contains(eps, s.endpoint) {
			s.up.Close()
			delete(f.sessions, client)
		}
	}
}

func (f *udpForwarder) close() {
	f.conn.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for client, s := range f.sessions {
		s.up.Close()
		delete(f.sessions, client)
	}
}

// serve reads clients' datagrams until the socket is closed.
func (f *udpForwarder) serve() {
	buf := make([]byte, 65535)
	for {
		n, client, err := f.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // an ICMP error for an earlier answer to a client, say
		}
		client = netip.AddrPortFrom(client.Addr().Unmap(), client.Port())
		s := f.session(client)
		if s == nil {
			continue
		}
		s.last.Store(time.Now().UnixNano())
		if _, err := s.up.Write(buf[:n]); err != nil {
			f.end(client, s) // refused: the next datagram starts another session
		}
	}
}

// session is the client's session, or a new one to the next endpoint (nil: none to go to).
func (f *udpForwarder) session(client netip.AddrPort) *udpSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.sessions[client]; ok {
		return s
	}
	eps := *f.endpoints.Load()
	if f.closed || len(eps) == 0 || len(f.sessions) >= maxUDPSessions {
		return nil
	}
	endpoint := eps[f.next.Add(1)%uint64(len(eps))]
	up, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(endpoint))
	if err != nil {
		return nil
	}
	s := &udpSession{up: up, endpoint: endpoint}
	s.last.Store(time.Now().UnixNano())
	f.sessions[client] = s
	go f.relay(client, s)
	return s
}

// relay sends the endpoint's answers to the client until the session ends.
func (f *udpForwarder) relay(client netip.AddrPort, s *udpSession) {
	buf := make([]byte, 65535)
	for {
		_ = s.up.SetReadDeadline(time.Now().Add(udpIdle / 4))
		n, err := s.up.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, s.last.Load())) < udpIdle {
				continue
			}
			f.end(client, s)
			return
		}
		s.last.Store(time.Now().UnixNano())
		_, _ = f.conn.WriteToUDPAddrPort(buf[:n], client)
	}
}

func (f *udpForwarder) end(client netip.AddrPort, s *udpSession) {
	s.up.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sessions[client] == s {
		delete(f.sessions, client)
	}
}
