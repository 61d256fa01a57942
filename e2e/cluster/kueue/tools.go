//go:build tools

// Builds the Kueue manager at a pinned release, in a module of its own: Kueue requires the
// LeaderWorkerSet API module at a version other than the LWS manager's.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
