//go:build tools

// Builds KEDA's operator and its external-metrics adapter at a pinned release, in a module of
// its own: KEDA pins client-go and controller-runtime at versions other than the rest.
package tools

import (
	_ "github.com/kedacore/keda/v2/cmd/adapter"
	_ "github.com/kedacore/keda/v2/cmd/operator"
)
