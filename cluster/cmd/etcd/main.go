// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3, the version
// k8s.io/kubernetes v1.34.4 is tested with), built from its Go module.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
