#!/usr/bin/env bash
# Copies the CRD from manifests/crd/ into the chart (a unit test fails when they differ).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cp "$root/manifests/crd/kimik3deployments.yaml" "$root/charts/kimik3-operator/crds/kimik3deployments.yaml"
