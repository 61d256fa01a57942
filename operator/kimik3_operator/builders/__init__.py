"""Pure functions from the typed spec to the manifests of the children. No I/O."""
