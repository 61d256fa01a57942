"""Rewrites LeaderWorkerSet's webhook configurations to call a manager on 127.0.0.1.

In a cluster the webhooks reach the manager through a Service; here the manager is a host
process, so each webhook gets `url: https://127.0.0.1:PORT/PATH` and the CA that signed the
manager's serving certificate.
"""

from __future__ import annotations

import base64
import sys

import yaml


def main() -> None:
    source, ca_path, port = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(ca_path, "rb") as ca_file:
        ca = base64.b64encode(ca_file.read()).decode()
    with open(source, encoding="utf-8") as manifests:
        docs = [d for d in yaml.safe_load_all(manifests) if d]
    for doc in docs:
        doc["metadata"]["name"] = "lws-" + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
            hook["timeoutSeconds"] = 10
            if path.endswith("--v1-pod"):
                # As LWS's own kustomize patches do: only pods that LWS made.
                hook["objectSelector"] = {
                    "matchExpressions": [
                        {"key": "leaderworkerset.sigs.k8s.io/name", "operator": "Exists"}
                    ]
                }
    yaml.safe_dump_all(docs, sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
