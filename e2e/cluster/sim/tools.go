//go:build tools

// llm-d's vLLM simulator at a pinned release, in a module of its own: the tests run two of
// them as a prefill and a decode engine that honour kv_transfer_params.
package tools

import (
	_ "github.com/llm-d/llm-d-inference-sim/cmd/llm-d-inference-sim"
)
