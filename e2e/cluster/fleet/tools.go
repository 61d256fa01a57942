//go:build tools

// The fleet components built from this module (go.mod says why they share it); the gateway
// stand-in is ./gateway.
package tools

import (
	_ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
	_ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
