#!/usr/bin/env bash
# Copies the CRD from manifests/crd/ into the chart and into the package (the CLI checks
# specs against it offline); a unit test fails when the copies differ.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cp "$root/manifests/crd/kimik3deployments.yaml" "$root/charts/kimik3-operator/crds/kimik3deployments.yaml"
cp "$root/manifests/crd/kimik3deployments.yaml" "$root/operator/kimik3_operator/data/crd.yaml"
