"""gateway/telemetry.py on its own: bounded label sets, the metric names, and the OTLP exporter (off by
default; on, it posts the spans to a real HTTP receiver on loopback)."""

from __future__ import annotations

import http.server
import threading

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from gateway.settings import Observability
from gateway.telemetry import Telemetry


def record(**changes) -> dict:
    base = {"router": "router-a", "router_version": "1", "worker": "w1", "chosen": "w1", "key_id": "k1",
            "status": "ok", "cost_usd": 0.002, "prompt_tokens": 10, "completion_tokens": 4, "latency_s": 0.3,
            "explanation": {"attempts": [{"worker": "w2", "error": "timeout: ..."},
                                         {"worker": "w3", "error": "skipped: its worst case is over the budget"}]}}
    return {**base, **changes}


def test_series_names_and_bounded_labels():
    telemetry = Telemetry(("router-a",))
    telemetry.bind_workers(["w1", "w2", "w3"])
    telemetry.settled(record())
    telemetry.settled(record(router="router-zzz", worker="w-unknown", status="weird", key_id="k2"))
    text = telemetry.exposition()
    assert 'routerops_gateway_routed_requests_total{router="router-a",status="ok",worker="w1"} 1.0' in text \
        or 'routerops_gateway_routed_requests_total{router="router-a",worker="w1",status="ok"} 1.0' in text
    assert 'router="other"' in text and 'worker="other"' in text and 'status="other"' in text
    assert "router-zzz" not in text and "w-unknown" not in text and "weird" not in text  # bounded sets
    assert 'routerops_gateway_fallbacks_total{router="router-a",worker="w2"} 1.0' in text  # a skip is no failure
    assert 'worker="w3"' not in text.split("routerops_gateway_fallbacks_total")[-1].split("\n#")[0]
    for name in ("routerops_gateway_spend_usd_total", "routerops_gateway_tokens_total",
                 "routerops_gateway_request_seconds_bucket"):
        assert name in text
    assert 'key="' not in text


def test_key_labels_when_asked():
    telemetry = Telemetry(("router-a",), Observability(key_labels=True))
    telemetry.bind_workers(["w1"])
    telemetry.settled(record())
    assert 'key="k1"' in telemetry.exposition()


class Receiver(http.server.BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        Receiver.bodies.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_spans_go_to_the_otlp_endpoint_only_when_set():
    assert Telemetry(("r",)).settings.otlp_endpoint == ""  # off by default
    server = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}/v1/traces"
        telemetry = Telemetry(("r",), Observability(otlp_endpoint=endpoint, service_name="gw-test"))
        with telemetry.tracer.start_as_current_span("chat.completions"), telemetry.worker_span("w1", stream=False):
            pass
        telemetry.shutdown()  # flushes the batch
    finally:
        server.shutdown()
    [(path, body)] = Receiver.bodies
    sent = ExportTraceServiceRequest.FromString(body)
    spans = [s for rs in sent.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert path == "/v1/traces" and sorted(s.name for s in spans) == ["chat.completions", "worker.call"]
    service = {a.key: a.value.string_value for a in sent.resource_spans[0].resource.attributes}["service.name"]
    assert service == "gw-test"
