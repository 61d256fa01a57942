"""Credentials in a URL (a mirror, a proxy) never reach a status, an event or a log."""

from __future__ import annotations

import logging

import pytest

from conftest import FakeKube, key_of, resource
from kimik3_operator.api.conditions import Condition
from kimik3_operator.controller.reconcile import Context, reconcile
from kimik3_operator.events import build_event
from kimik3_operator.redact import RedactingFilter, redact

SECRET = "s3cr3t-pass"


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        (f"https://alice:{SECRET}@hub.corp/api", "https://***@hub.corp/api"),
        (f"HTTPS_PROXY=http://{SECRET}@proxy:3128", "HTTPS_PROXY=http://***@proxy:3128"),
        (f"socks5h://u:{SECRET}@10.0.0.1:1080 refused", "socks5h://***@10.0.0.1:1080 refused"),
        (f"Authorization: Bearer {SECRET}xyz", "Authorization: Bearer ***"),
        ("token hf_abcdefghijklmnopqrstuvwxyz0123 leaked", "token *** leaked"),
        (
            f"GET https://hub.corp/f?token={SECRET}&rev=main",
            "GET https://hub.corp/f?token=***&rev=main",
        ),
        (
            f"s3.amazonaws.com/b/k?X-Amz-Signature={SECRET}",
            "s3.amazonaws.com/b/k?X-Amz-Signature=***",
        ),
        (f"Authorization: Basic {SECRET}QQ==", "Authorization: Basic ***"),
        (f"x-api-key: {SECRET}", "x-api-key: ***"),
        (f"X-Api-Key={SECRET} sent", "X-Api-Key=*** sent"),
        (f"HTTPS_PROXY=alice:{SECRET}@proxy.corp:3128", "HTTPS_PROXY=***@proxy.corp:3128"),
        (f"proxy alice:{SECRET}@10.0.0.1 refused", "proxy ***@10.0.0.1 refused"),
    ],
)
def test_credentials_are_taken_out_and_the_address_kept(text: str, kept: str) -> None:
    assert redact(text) == kept
    assert SECRET not in redact(text)


def test_plain_text_is_untouched() -> None:
    text = "https://huggingface.co/moonshotai/Kimi-K3 returned 404 for user@example.com"
    assert redact(text) == text
    for kept in (
        "http://proxy.corp:3128 at 12:30, vllm/vllm-openai:v0.33.0@sha256:abc",
        "https://hub.corp/f?revision=main&limit=5",
        "image kimik3.local/vllm-cpu:v0.32.0 on node cpu-1",
    ):
        assert redact(kept) == kept


def test_the_status_and_events_carry_no_credentials(kube: FakeKube) -> None:
    """A probe report whose errors quote the user's proxy URL, as vLLM's would."""
    body = resource()
    body["status"] = {
        "conditions": [
            {
                "type": "SpeculationEffective",
                "status": "Unknown",
                "reason": "X",
                "message": f"via https://bob:{SECRET}@mirror.corp/",
            }
        ]
    }
    kube.put(body)
    reconcile(kube, key_of(body), Context(clock=lambda: "2026-12-03T00:00:00Z"))
    stored = kube.get("serving.kimik3.io/v1alpha1", "KimiK3Deployment", "k3", "llm")
    assert SECRET not in str(stored)
    event = build_event(
        body, Condition("Degraded", "True", "ProbeFailed", f"http://a:{SECRET}@h/"), "now"
    )
    assert SECRET not in event["message"]


def test_log_records_are_redacted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RedactingFilter())
    log = logging.getLogger("kimik3.test")
    with caplog.at_level(logging.INFO):
        log.info("cannot read %s", f"http://u:{SECRET}@10.1.1.1:8000/metrics")
        try:
            raise OSError(f"proxy http://u:{SECRET}@p:1 refused")
        except OSError:
            log.exception("failed")
    assert SECRET not in caplog.text
    assert "http://***@10.1.1.1:8000/metrics" in caplog.text
