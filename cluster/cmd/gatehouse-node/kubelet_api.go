package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// startKubeletAPI serves the part of the kubelet API the API server proxies for
// `kubectl logs`: GET /containerLogs/{namespace}/{pod}/{container}. It listens on the
// node IP with a self-signed certificate (the API server runs without
// --kubelet-certificate-authority) and, given the cluster CA, accepts only clients
// with a certificate it signed.
func startKubeletAPI(a *agent, nodeIP net.IP, clientCA string) (net.Listener, error) {
	cert, err := selfSigned(nodeIP)
	if err != nil {
		return nil, err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--client-ca %s: no certificates", clientCA)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	ln, err := tls.Listen("tcp", net.JoinHostPort(nodeIP.String(), "0"), cfg)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", a.serveLogs)
	go func() { _ = (&http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}).Serve(ln) }()
	return ln, nil
}

func selfSigned(ip net.IP) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: "gatehouse-node"},
		IPAddresses:  []net.IP{ip},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// logQuery is the subset of PodLogOptions the handler honours.
type logQuery struct {
	follow, timestamps bool
	since              time.Time
	tail               int // -1: all
	limit              int64
}

func parseLogQuery(r *http.Request) (logQuery, error) {
	q := r.URL.Query()
	lq := logQuery{tail: -1, follow: q.Get("follow") == "true", timestamps: q.Get("timestamps") == "true"}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return lq, fmt.Errorf("sinceTime: %w", err)
		}
		lq.since = t
	}
	if v := q.Get("sinceSeconds"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return lq, fmt.Errorf("sinceSeconds: %w", err)
		}
		lq.since = time.Now().Add(-time.Duration(n) * time.Second)
	}
	if v := q.Get("tailLines"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return lq, fmt.Errorf("tailLines: %w", err)
		}
		lq.tail = n
	}
	if v := q.Get("limitBytes"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return lq, fmt.Errorf("limitBytes: %w", err)
		}
		lq.limit = n
	}
	return lq, nil
}

func (a *agent) serveLogs(w http.ResponseWriter, r *http.Request) {
	rt := a.runtimeFor(r.PathValue("namespace"), r.PathValue("pod"))
	if rt == nil {
		http.Error(w, "pod not running on this node", http.StatusNotFound)
		return
	}
	var c *containerState
	for _, cs := range rt.containers {
		if cs.spec.Name == r.PathValue("container") {
			c = cs
		}
	}
	if c == nil {
		http.Error(w, "no such container", http.StatusNotFound)
		return
	}
	lq, err := parseLogQuery(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f, err := os.Open(c.logPath())
	if err != nil {
		http.Error(w, "no logs yet: "+err.Error(), http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "text/plain")
	var written int64
	emit := func(line string) bool {
		ts, rest, _ := strings.Cut(line, " ")
		_, msg, _ := strings.Cut(rest, " ")
		if !lq.since.IsZero() {
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil && t.Before(lq.since) {
				return true
			}
		}
		out := msg + "\n"
		if lq.timestamps {
			out = ts + " " + out
		}
		if lq.limit > 0 && written+int64(len(out)) > lq.limit {
			out = out[:lq.limit-written]
		}
		n, err := io.WriteString(w, out)
		written += int64(n)
		return err == nil && (lq.limit == 0 || written < lq.limit)
	}
	rd := bufio.NewReader(f)
	var lines []string
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			// A partial last line is left for the follow loop.
			_, _ = f.Seek(-int64(len(line)), io.SeekCurrent)
			rd.Reset(f)
			break
		}
		lines = append(lines, strings.TrimSuffix(line, "\n"))
	}
	if lq.tail >= 0 && len(lines) > lq.tail {
		lines = lines[len(lines)-lq.tail:]
	}
	for _, l := range lines {
		if !emit(l) {
			return
		}
	}
	if !lq.follow {
		return
	}
	flusher, _ := w.(http.Flusher)
	var partial string
	for {
		if flusher != nil {
			flusher.Flush()
		}
		last := false // the Pod is gone: send what its containers wrote last, then end
		select {
		case <-r.Context().Done():
			return
		case <-rt.done:
			last = true
		case <-time.After(200 * time.Millisecond):
		}
		for {
			chunk, err := rd.ReadString('\n')
			partial += chunk
			if err != nil {
				break
			}
			if !emit(strings.TrimSuffix(partial, "\n")) {
				return
			}
			partial = ""
		}
		if last {
			return
		}
	}
}
