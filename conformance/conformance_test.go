// Package conformance runs the upstream Gateway API conformance suite. Every option comes
// from the suite's own flags (see conformance/run); supported features are inferred from the
// GatewayClass status that Gatehouse writes, so nothing is claimed here that Gatehouse does
// not itself claim.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
