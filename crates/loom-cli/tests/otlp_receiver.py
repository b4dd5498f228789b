"""An OTLP/HTTP trace receiver for tests/otel.rs, written on the official OpenTelemetry protobuf
definitions (PyPI `opentelemetry-proto`): each POST to /v1/traces is decoded as an
`ExportTraceServiceRequest`; its raw body is appended to `<out>.raw` and its spans, as JSON
lines, to `<out>` (ids in hexadecimal, attribute values unwrapped). Prints its port, then
serves until killed."""

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

OUT = sys.argv[1]


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value"):
        return MessageToDict(getattr(any_value, kind))
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    return getattr(any_value, kind)


def attributes(pairs):
    return {pair.key: value(pair.value) for pair in pairs}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_response(404)
            self.end_headers()
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with open(OUT + ".raw", "ab") as raw:
            raw.write(body)
        with open(OUT, "a", encoding="utf-8") as out:
            for resource_spans in request.resource_spans:
                resource = attributes(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        record = {
                            "resource": resource,
                            "scope": scope_spans.scope.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": span.kind,
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "status": {"code": span.status.code, "message": span.status.message},
                            "attributes": attributes(span.attributes),
                            "events": [
                                {"name": e.name, "time": e.time_unix_nano, "attributes": attributes(e.attributes)}
                                for e in span.events
                            ],
                            "content_type": self.headers.get("Content-Type"),
                            "authorization": self.headers.get("Authorization"),
                        }
                        out.write(json.dumps(record, ensure_ascii=False) + "\n")
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
