"""The KimiK3Deployment API: typed spec, vocabulary and names."""
