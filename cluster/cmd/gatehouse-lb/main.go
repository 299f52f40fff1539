// Command gatehouse-lb gives Services of type LoadBalancer an address on the local test
// cluster (there is no cloud here) and forwards their TCP ports to the Services' ready
// endpoints through one haproxy process in master-worker mode, and their UDP ports through
// a forwarder of its own (udp.go: haproxy does not proxy UDP).
//
//   - Addresses come from --address-range (default 127.200.0.0/24: every 127/8 address is
//     local on Linux, so haproxy binds them with no interface set-up and this host reaches
//     them). The allocation is written to status.loadBalancer.ingress and read back from
//     there on start, so it survives restarts.
//   - Each (Service, TCP port) is a haproxy frontend on <ip>:<port> with a backend of server
//     slots (sized with headroom) health-checked every second.
//   - Endpoint changes go through haproxy's runtime API (set server addr / state), which
//     touches no established connection. A change of the set of frontends, a backend that
//     outgrows its slots or a change of balancing is a seamless reload through the master CLI.
//
// See cluster/README.md, "LoadBalancer Services (gatehouse-lb)".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("gatehouse-lb: ")

	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else in-cluster)")
	stateDir := flag.String("state-dir", "", "directory for haproxy's configuration, pid file and sockets (required)")
	addressRange := flag.String("address-range", "127.200.0.0/24", "CIDR the LoadBalancer addresses are allocated from; the host must be able to bind them")
	haproxyBin := flag.String("haproxy", "haproxy", "haproxy executable (2.6 or newer)")
	readyFile := flag.String("ready-file", "", "file written once the informers have synced and haproxy runs; removed on exit")
	resync := flag.Duration("resync", 0, "informer resync period (0: none; every change is event-driven anyway)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: gatehouse-lb --state-dir DIR [flags]\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*kubeconfig, *stateDir, *addressRange, *haproxyBin, *readyFile, *resync); err != nil {
		log.Printf("error: %v", err)
		os.Exit(1)
	}
}

func run(kubeconfig, stateDir, addressRange, haproxyBin, readyFile string, resync time.Duration) error {
	if stateDir == "" {
		return errors.New("--state-dir is required")
	}
	prefix, err := netip.ParsePrefix(addressRange)
	if err != nil {
		return fmt.Errorf("--address-range: %w", err)
	}
	pool, err := newAllocator(prefix)
	if err != nil {
		return fmt.Errorf("--address-range: %w", err)
	}
	stateDir, err = filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if readyFile != "" {
		if readyFile, err = filepath.Abs(readyFile); err != nil {
			return err
		}
		_ = os.Remove(readyFile) // a stale one from an earlier run must not say ready
	}

	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "gatehouse-lb"
	cfg.QPS, cfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}

	lb, err := newHAProxy(haproxyBin, stateDir)
	if err != nil {
		return err
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()

	c := newController(client, pool, lb, resync)
	log.Printf("starting: address range %s, state %s, haproxy %s", prefix, stateDir, lb.bin)
	ready := func() {
		if readyFile == "" {
			return
		}
		if err := writeFileAtomic(readyFile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			log.Printf("writing --ready-file: %v", err)
			return
		}
		log.Printf("ready (%s)", readyFile)
	}
	runErr := c.run(ctx, ready)

	// SIGTERM (or a fatal error): stop haproxy, then exit. The Services keep their status,
	// so the next start hands out the same addresses.
	if readyFile != "" {
		_ = os.Remove(readyFile)
	}
	lb.stop()
	c.shutdown()
	if runErr != nil && ctx.Err() == nil {
		return runErr
	}
	log.Printf("stopped")
	return nil
}

// writeFileAtomic writes through a temporary file in the same directory and renames it,
// so a reader never sees half a file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
