package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probe runs the container's probes for one run of its process (ctx ends when it exits),
// with the kubelet's semantics: the startup probe first (liveness and readiness wait for
// it; failureThreshold failures kill the container), then liveness (failureThreshold
// consecutive failures kill the container, which is then restarted with back-off) and
// readiness (successThreshold consecutive successes make it ready, failureThreshold
// consecutive failures not ready). initialDelaySeconds counts from the start of the process.
//
// Without a readinessProbe the container is ready once every TCP port it declares accepts
// connections — stricter than the kubelet (ready as soon as it runs), so a backend is
// never published before it listens — or once it has run for portlessReadyAfter without
// doing so: then it is ready as the kubelet would have it. Some Pods declare a port on
// purpose that nothing listens on (the conformance suite's HTTPRouteRetryConnectionError
// needs a Ready endpoint that refuses connections).
func (c *containerState) probe(ctx context.Context, start time.Time) {
	spec := c.spec
	if p := spec.StartupProbe; p != nil {
		fails, done := 0, false
		c.probeEvery(ctx, p, start, func(ok bool, msg string) bool {
			if ok {
				done = true
				c.mu.Lock()
				c.started = true
				c.mu.Unlock()
				c.pod.changed()
				return true
			}
			if fails++; fails >= threshold(p.FailureThreshold, 3) {
				c.unhealthy("Startup", p, msg)
				return true
			}
			return false
		})
		if !done {
			return
		}
	}
	if p := spec.LivenessProbe; p != nil {
		go func() {
			fails := 0
			c.probeEvery(ctx, p, start, func(ok bool, msg string) bool {
				if ok {
					fails = 0
					return false
				}
				if fails++; fails >= threshold(p.FailureThreshold, 3) {
					c.unhealthy("Liveness", p, msg)
					return true
				}
				return false
			})
		}()
	}
	p := spec.ReadinessProbe
	if p == nil {
		for {
			ok := true
			for _, port := range spec.Ports {
				if port.Protocol == "" || port.Protocol == corev1.ProtocolTCP {
					ok = ok && c.dial(ctx, int(port.ContainerPort), time.Second) == nil
				}
			}
			c.setReady(ctx, ok || time.Since(start) >= portlessReadyAfter)
			if !sleep(ctx, 500*time.Millisecond) {
				return
			}
		}
	}
	succ, fails := 0, 0
	c.probeEvery(ctx, p, start, func(ok bool, msg string) bool {
		if ok {
			succ, fails = succ+1, 0
			if succ >= threshold(p.SuccessThreshold, 1) {
				c.setReady(ctx, true)
			}
		} else {
			succ, fails = 0, fails+1
			if fails == threshold(p.FailureThreshold, 3) {
				c.pod.event(corev1.EventTypeWarning, "Unhealthy", "Readiness probe failed: "+msg)
			}
			if fails >= threshold(p.FailureThreshold, 3) {
				c.setReady(ctx, false)
			}
		}
		return false
	})
}

// portlessReadyAfter is how long a container without a readinessProbe may run with a
// declared TCP port that refuses connections before it is reported ready anyway. Real
// backends listen within milliseconds of starting.
const portlessReadyAfter = 10 * time.Second

// unhealthy kills the current process for a failed startup or liveness probe; the
// supervisor restarts it with back-off.
func (c *containerState) unhealthy(kind string, p *corev1.Probe, msg string) {
	c.pod.event(corev1.EventTypeWarning, "Unhealthy", kind+" probe failed: "+msg)
	c.pod.logf("container %s: %s probe failed (%s); restarting it", c.spec.Name, strings.ToLower(kind), msg)
	grace := c.pod.gracePeriod()
	if p.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*p.TerminationGracePeriodSeconds) * time.Second
	}
	go c.stop(time.Now().Add(grace), true, false, fmt.Sprintf(": failed %s probe, will be restarted", strings.ToLower(kind)))
}

func (c *containerState) setReady(ctx context.Context, ready bool) {
	c.mu.Lock()
	changed := c.running && ctx.Err() == nil && c.ready != ready
	if changed {
		c.ready = ready
	}
	c.mu.Unlock()
	if changed {
		c.pod.changed()
	}
}

func threshold(v, def int32) int {
	if v <= 0 {
		return int(def)
	}
	return int(v)
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// probeEvery runs p after its initial delay and then every period until handle returns
// true or ctx ends.
func (c *containerState) probeEvery(ctx context.Context, p *corev1.Probe, start time.Time, handle func(ok bool, msg string) bool) {
	if !sleep(ctx, time.Until(start.Add(time.Duration(p.InitialDelaySeconds)*time.Second))) {
		return
	}
	for {
		ok, msg := c.check(ctx, p)
		if ctx.Err() != nil || handle(ok, msg) {
			return
		}
		if !sleep(ctx, seconds(p.PeriodSeconds, 10)) {
			return
		}
	}
}

// check runs a probe once: httpGet (2xx and 3xx pass; redirects are not followed),
// tcpSocket (connects), exec (exits 0, run in the container). gRPC probes always fail.
func (c *containerState) check(ctx context.Context, p *corev1.Probe) (bool, string) {
	timeout := seconds(p.TimeoutSeconds, 1)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.HTTPGet != nil:
		return c.httpGet(ctx, p.HTTPGet)
	case p.TCPSocket != nil:
		if err := c.dial(ctx, c.portNumber(p.TCPSocket.Port), timeout); err != nil {
			return false, err.Error()
		}
		return true, ""
	case p.Exec != nil:
		code, out, err := c.execIn(ctx, p.Exec.Command)
		if err != nil {
			return false, err.Error()
		}
		if code != 0 {
			return false, fmt.Sprintf("command %q exited with %d: %s", p.Exec.Command, code, strings.TrimSpace(string(out)))
		}
		return true, ""
	default:
		return false, "gRPC probes are not supported by gatehouse-node"
	}
}

var probeClient = &http.Client{
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet: no verification
		DisableKeepAlives: true,
	},
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// httpGet requests the handler's URL (host defaults to the Pod IP) with its headers.
func (c *containerState) httpGet(ctx context.Context, h *corev1.HTTPGetAction) (bool, string) {
	host := h.Host
	if host == "" {
		host = c.pod.ip().String()
	}
	scheme := "http"
	if h.Scheme == corev1.URISchemeHTTPS {
		scheme = "https"
	}
	path := h.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(c.portNumber(h.Port))), path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("User-Agent", "kube-probe/1.34")
	for _, hd := range h.HTTPHeaders {
		if strings.EqualFold(hd.Name, "Host") {
			req.Host = hd.Value
		} else {
			req.Header.Add(hd.Name, hd.Value)
		}
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return false, err.Error()
	}
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
	}
	return true, ""
}

func (c *containerState) dial(ctx context.Context, port int, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(c.pod.ip().String(), strconv.Itoa(port)))
	if err != nil {
		return err
	}
	return conn.Close()
}

// portNumber resolves a probe port given by number or by the name of a container port.
func (c *containerState) portNumber(p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	n, _ := strconv.Atoi(p.StrVal)
	return n
}
