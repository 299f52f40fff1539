// Command kubectl is the upstream kubectl (k8s.io/kubectl v0.34.4, same as
// k8s.io/kubernetes/cmd/kubectl), built from its Go module. Tests, the cluster
// scripts (CRD install) and the conformance run use it.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // client auth plugins
)

func main() {
	// Parse -v early so klog is configured while the command tree is built.
	logs.GlogSetter(cmd.GetLogVerbosity(os.Args)) //nolint:errcheck
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
