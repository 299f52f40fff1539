// Command kube-controller-manager is the upstream Kubernetes controller manager
// (k8s.io/kubernetes v1.34.4, pinned in ../../go.mod). The conformance run needs its
// Deployment, ReplicaSet, EndpointSlice, namespace and service-account controllers:
// the suite's backends are Deployments behind Services.
package main

import (
	"os"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
