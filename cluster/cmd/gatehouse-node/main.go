// Command gatehouse-node is a small node agent for tests: it plays kubelet on a machine
// without a container runtime, for the local test cluster (cluster/up with
// GATEHOUSE_CLUSTER_NODE=1) and the Gateway API conformance run.
//
// It registers one Node, binds unscheduled Pods to it (no kube-scheduler), and runs each
// Pod's containers as real processes, every Pod in its own network namespace with its own
// IP on a bridge it creates. A container image is either
//
//   - mapped to a binary on this machine (--image IMAGE=PATH): the binary runs on the host
//     filesystem, as root, in the Pod's network namespace (the conformance backends), or
//   - found in a local OCI image layout (--image-store DIR): its layers are unpacked once
//     and the container runs in that root filesystem, in its own mount, PID and UTS
//     namespaces, with the user, capabilities and volumes the Pod asks for (sandbox.go).
//
// It reports Pod status, runs startup/liveness/readiness probes, runs preStop hooks and
// honours the grace period when Pods are deleted, and serves container logs on the kubelet
// API so that `kubectl logs` works. It also plays kube-proxy and cluster DNS for its Pods:
// Service environment variables (services.go), ClusterIP rules in nftables (proxy.go) and a
// DNS server on the node address (dns.go). An image it cannot find leaves its Pod Pending with
// ErrImagePull; it never reports such a Pod Ready. See cluster/README.md.
//
// Subcommands `exec-container` and `sysctl` are internal: they run inside the Pod's
// network namespace (`ip netns exec`) to become a container, or to set the Pod's sysctls.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

type imageFlags map[string]string

func (f imageFlags) String() string { return fmt.Sprint(map[string]string(f)) }
func (f imageFlags) Set(v string) error {
	image, path, ok := strings.Cut(v, "=")
	if !ok || image == "" || path == "" {
		return fmt.Errorf("want IMAGE=PATH, got %q", v)
	}
	f[image] = path
	return nil
}

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "exec-container":
			execContainer(os.Args[2:])
			return
		case "sysctl":
			setSysctls(os.Args[2:])
			return
		}
	}
	images := imageFlags{}
	var cfg config
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig")
	flag.StringVar(&cfg.nodeName, "node-name", "gatehouse-node", "name of the Node to register")
	flag.StringVar(&cfg.stateDir, "state-dir", "", "directory for pod volumes, logs and unpacked images (required)")
	flag.StringVar(&cfg.bridge, "bridge", "ghnode0", "bridge interface the pods attach to (created, and deleted on exit)")
	flag.StringVar(&cfg.podCIDR, "pod-cidr", "10.244.0.0/16", "pod network; the first address is the bridge (node) IP")
	flag.StringVar(&cfg.netnsPrefix, "netns-prefix", "ghpod-", "name prefix of the pods' network namespaces")
	flag.StringVar(&cfg.clientCA, "client-ca", "", "CA that signs the API server's kubelet client certificate (kubelet API clients are verified against it)")
	flag.StringVar(&cfg.readyFile, "ready-file", "", "write the kubelet API address here once the Node is registered")
	flag.Var(images, "image", "IMAGE=PATH: run containers of IMAGE with the binary PATH on the host filesystem (repeatable; wins over --image-store)")
	flag.StringVar(&cfg.imageStore, "image-store", "", "OCI image layout directory (index.json, blobs/) whose org.opencontainers.image.ref.name annotations name the images")
	flag.DurationVar(&cfg.backoffInitial, "backoff-initial", 10*time.Second, "delay before restarting a container that exited; doubles on every restart (kubelet: 10s)")
	flag.DurationVar(&cfg.backoffMax, "backoff-max", 5*time.Minute, "longest restart delay (kubelet: 5m); a container that ran twice this long starts again from --backoff-initial")
	flag.StringVar(&cfg.clusterDomain, "cluster-domain", "cluster.local", "DNS domain of the cluster (the cluster DNS answers for it; Pods' search lists end in it)")
	flag.Parse()
	if cfg.stateDir == "" {
		log.Fatal("--state-dir is required")
	}
	if cfg.backoffInitial <= 0 || cfg.backoffMax < cfg.backoffInitial {
		log.Fatal("--backoff-initial must be > 0 and <= --backoff-max")
	}
	cfg.images = images

	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	if cfg.apiServer, err = apiServerAddr(restCfg.Host); err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, client, cfg); err != nil {
		log.Fatalf("gatehouse-node: %v", err)
	}
}

type config struct {
	kubeconfig, nodeName, stateDir, bridge, podCIDR, netnsPrefix, clientCA, readyFile string
	imageStore, clusterDomain                                                         string
	images                                                                            map[string]string
	backoffInitial, backoffMax                                                        time.Duration
	apiServer                                                                         netip.AddrPort // where the `kubernetes` Service leads
}

// apiServerAddr is the IPv4 address and port of the kubeconfig's server URL (a host name is
// resolved to its first IPv4 address). The address is unmapped: net.ResolveTCPAddr gives a
// 16-byte IP, which netip would keep as ::ffff:a.b.c.d, and nft (table ip) cannot DNAT to
// that.
func apiServerAddr(server string) (netip.AddrPort, error) {
	u, err := url.Parse(server)
	if err != nil || u.Host == "" {
		return netip.AddrPort{}, fmt.Errorf("server %q is not a URL", server)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	addr, err := net.ResolveTCPAddr("tcp4", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("server %q: %w", server, err)
	}
	ap := addr.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func run(ctx context.Context, client kubernetes.Interface, cfg config) error {
	network, err := newPodNetwork(cfg.bridge, cfg.podCIDR, cfg.netnsPrefix)
	if err != nil {
		return err
	}
	defer network.teardown()
	if err := os.MkdirAll(cfg.stateDir, 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cidr, err := netip.ParsePrefix(network.cidr.String())
	if err != nil {
		return err
	}
	proxy, err := newServiceProxy(cfg.bridge, cidr, cfg.apiServer)
	if err != nil {
		return err
	}
	defer proxy.teardown()
	hostDNS := hostResolvConf()
	dnsServer, err := newDNSServer(network.gateway, cfg.clusterDomain, upstreamsOf(hostDNS, network.gateway))
	if err != nil {
		return err
	}
	defer dnsServer.shutdown()
	agent := newAgent(client, cfg, network, self)
	agent.proxy, agent.dns, agent.hostDNS = proxy, dnsServer, hostDNS

	api, err := startKubeletAPI(agent, network.gateway, cfg.clientCA)
	if err != nil {
		return err
	}
	defer api.Close()
	port := api.Addr().(*net.TCPAddr).Port
	if err := agent.registerNode(ctx, port); err != nil {
		return err
	}
	log.Printf("node %s registered: pod network %s on %s, kubelet API %s, image store %q; Service rules in nftables table ip %s (kubernetes Service -> %s), cluster DNS %s:53 for %s", cfg.nodeName, cfg.podCIDR, cfg.bridge, api.Addr(), cfg.imageStore, proxy.table, cfg.apiServer, network.gateway, cfg.clusterDomain)
	if cfg.readyFile != "" {
		if err := os.WriteFile(cfg.readyFile, []byte(api.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	go agent.heartbeat(ctx, port)
	agent.run(ctx)

	shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	agent.stopAll(shutdown)
	return nil
}
