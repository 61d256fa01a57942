//go:build tools

// The endpoint picker (EPP) of the Gateway API Inference Extension at a pinned release, in a
// module of its own: it pins client-go, controller-runtime and Envoy's protos at versions of
// its own.
package tools

import (
	_ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
)
