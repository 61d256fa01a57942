"""Names of the children of one KimiK3Deployment. Builders never format names themselves.

How long a KimiK3Deployment's name may be follows from what LeaderWorkerSet makes of it: one
StatefulSet per group for the workers, ``<name>-<group index>``, and the StatefulSet
controller labels each pod with ``<statefulset>-<10-character revision hash>``, a label value
of at most 63 characters. So a StatefulSet name has at most 52 characters, and with group
indexes up to ``MAX_REPLICAS - 1`` a KimiK3Deployment's name at most ``MAX_NAME_LENGTH`` (49).
The name is also the Service's, so a DNS-1035 label: lower-case letters, digits and ``-``,
starting with a letter. The CRD states both rules; ``name_error`` states them again for
resources stored before it did.

Children whose suffix would take them over 63 characters (a Job's name is a label value of
its pods) are named ``<prefix>-<hash of the whole name>-<suffix>``: two long names with a
common prefix never share a child.
"""

from __future__ import annotations

import hashlib
import re

LABEL_VALUE_LIMIT = 63
STATEFULSET_REVISION_SUFFIX = 11  # "-" and the 10-character controller-revision hash
MAX_REPLICAS = 64  # the CRD's spec.replicas maximum
MAX_NAME_LENGTH = (
    LABEL_VALUE_LIMIT - STATEFULSET_REVISION_SUFFIX - len("-") - len(str(MAX_REPLICAS - 1))
)
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def name_error(name: str) -> str | None:
    """Why a KimiK3Deployment cannot be served under this name, or None."""
    if len(name) > MAX_NAME_LENGTH:
        return (
            f"metadata.name {name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH} fit "
            "the names LeaderWorkerSet derives from it (recreate it under a shorter name)"
        )
    if not DNS_1035_LABEL.match(name):
        return (
            f"metadata.name {name!r} is not a DNS-1035 label (lower-case letters, digits and "
            "'-', starting with a letter), which its Service's name must be; recreate it "
            "under such a name"
        )
    return None


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def child(name: str, suffix: str) -> str:
    """``<name>-<suffix>``, or where that is over 63 characters, the name cut short with a
    hash of all of it."""
    full = f"{name}-{suffix}"
    if len(full) <= LABEL_VALUE_LIMIT:
        return full
    keep = LABEL_VALUE_LIMIT - len(suffix) - len(_short(name)) - 2
    return f"{name[:keep].rstrip('-')}-{_short(name)}-{suffix}"


def leader_worker_set(name: str) -> str:
    return name


# The DisaggregatedSet's controller names each role's LeaderWorkerSet
# <set>-<8-character revision>-<role>, which must fit where the deployment's own
# LeaderWorkerSet's name does (MAX_NAME_LENGTH).
DS_REVISION = 8
LONGEST_ROLE = len("prefill")
MAX_SET_NAME = MAX_NAME_LENGTH - 1 - DS_REVISION - 1 - LONGEST_ROLE


def disaggregated_set(name: str) -> str:
    """The deployment's name, or where it is too long for the role's LeaderWorkerSets, the
    name cut short with a hash of all of it."""
    if len(name) <= MAX_SET_NAME:
        return name
    keep = MAX_SET_NAME - len(_short(name)) - 1
    return f"{name[:keep].rstrip('-')}-{_short(name)}"


def service(name: str) -> str:
    return name


def pod_monitor(name: str) -> str:
    return name


def scaled_object(name: str) -> str:
    return name


def inference_pool(name: str) -> str:
    return name


def http_route(name: str) -> str:
    return name


def endpoint_picker(name: str) -> str:
    """The EPP's Deployment, Service, ConfigMap, ServiceAccount and RoleBinding."""
    return child(name, "epp")


def preflight_job(name: str, probe_key: str) -> str:
    return child(name, f"preflight-{_short(probe_key)}")


def probe_config_map(name: str) -> str:
    return child(name, "preflight-probe")


def model_cache_claim(name: str) -> str:
    return child(name, "model-cache")


def download_job(name: str, cache_key: str) -> str:
    return child(name, f"download-{_short(cache_key)}")


def collect_job(name: str, cache_key: str) -> str:
    return child(name, f"collect-{_short(cache_key)}")


def download_config_map(name: str) -> str:
    return child(name, "download-script")


def endpoint(name: str, namespace: str, port: int) -> str:
    return f"http://{service(name)}.{namespace}.svc:{port}"
