"""The OpenAPI document (``/openapi.json``), from the request schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import rt
from rt.http.schemas import BODIES, WsFrame

OPTIONAL_BODIES = frozenset({"/pause_generation", "/flush_cache", "/continue_generation"})

ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
}


def document(routes: dict[tuple[str, str], str]) -> dict[str, Any]:
    """``routes``: (method, path) → summary."""
    models: list[type[BaseModel]] = [*BODIES.values(), WsFrame]
    refs, schema = models_json_schema(
        [(m, "validation") for m in models], ref_template="#/components/schemas/{model}"
    )
    schemas = dict(schema.get("$defs", {}))
    schemas["Error"] = ERROR
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), summary in sorted(routes.items(), key=lambda r: r[0][1]):
        op: dict[str, Any] = {
            "summary": summary,
            "responses": {
                "200": {"description": "OK"},
                "default": {
                    "description": "An error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        }
        body = BODIES.get(path)
        if body is not None and method in ("POST", "PUT"):
            op["requestBody"] = {
                "required": path not in OPTIONAL_BODIES,
                "content": {"application/json": {"schema": refs[(body, "validation")]}},
            }
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "rt", "version": rt.__version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
