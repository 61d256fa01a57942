//go:build tools

// Package tools pins the LeaderWorkerSet manager built by build-tools.sh.
package tools

import _ "sigs.k8s.io/lws/cmd"
