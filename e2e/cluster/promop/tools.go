//go:build tools

// Package tools pins the Prometheus Operator built by build-tools.sh, for the test that its
// monitor selection by label picks up what the chart and the operator label.
package tools

import _ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
