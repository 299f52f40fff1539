//go:build tools

// Package tools pins h2spec, built by scripts/h2spec.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
