// Command gatehouse-node is a small node agent for tests: it plays kubelet on a machine
// without a container runtime so the Gateway API conformance suite can deploy its backends.
//
// It registers one Node, binds unscheduled Pods to it (no kube-scheduler), and runs each
// Pod's containers as real processes built from their Go modules, every Pod in its own
// network namespace with its own IP on a bridge it creates. It reports Pod status and
// readiness, finalises deleted Pods, and serves container logs on the kubelet API so that
// `kubectl logs` works. An image it has no build for leaves its Pod Pending with a
// visible reason; it never reports such a Pod Ready.
//
// Subcommand `exec-container` is internal: it runs inside `ip netns exec` (a private
// mount namespace), bind-mounts the Pod's volumes and execs the container binary.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
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
	if len(os.Args) > 1 && os.Args[1] == "exec-container" {
		execContainer(os.Args[2:])
		return
	}
	images := imageFlags{}
	var cfg config
	flag.StringVar(&cfg.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig")
	flag.StringVar(&cfg.nodeName, "node-name", "gatehouse-node", "name of the Node to register")
	flag.StringVar(&cfg.stateDir, "state-dir", "", "directory for pod volumes and logs (required)")
	flag.StringVar(&cfg.bridge, "bridge", "ghnode0", "bridge interface the pods attach to")
	flag.StringVar(&cfg.podCIDR, "pod-cidr", "10.244.0.0/16", "pod network; the first address is the bridge (node) IP")
	flag.StringVar(&cfg.clientCA, "client-ca", "", "CA that signs the API server's kubelet client certificate (kubelet API clients are verified against it)")
	flag.StringVar(&cfg.readyFile, "ready-file", "", "write the kubelet API address here once the Node is registered")
	flag.Var(images, "image", "IMAGE=PATH: run containers of IMAGE with the binary PATH (repeatable)")
	flag.Parse()
	if cfg.stateDir == "" {
		log.Fatal("--state-dir is required")
	}
	cfg.images = images

	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	restCfg.QPS, restCfg.Burst = 50, 100
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
	kubeconfig, nodeName, stateDir, bridge, podCIDR, clientCA, readyFile string
	images                                                               map[string]string
}

func run(ctx context.Context, client kubernetes.Interface, cfg config) error {
	network, err := newPodNetwork(cfg.bridge, cfg.podCIDR)
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
	agent := newAgent(client, cfg, network, self)

	api, err := startKubeletAPI(agent, network.gateway, cfg.clientCA)
	if err != nil {
		return err
	}
	defer api.Close()
	port := api.Addr().(*net.TCPAddr).Port
	if err := agent.registerNode(ctx, port); err != nil {
		return err
	}
	log.Printf("node %s registered: pod network %s on %s, kubelet API %s", cfg.nodeName, cfg.podCIDR, cfg.bridge, api.Addr())
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
