"""The OpenAPI document: request bodies and error responses of routes that read their body
themselves.

The generation endpoints parse the raw body (`ChatCompletionRequest.parse(await
request.body())`) so that every error is OpenAI-shaped and names its field; FastAPI then
sees no body parameter and documents none, and fuzzers or generated clients see no schema.
`document` adds each body from the same pydantic model the handler parses with, the success
bodies (JSON, or Server-Sent Events when streaming), and the OpenAI error responses.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"

# Error statuses every /v1 route may answer, and what each means here.
ERRORS = {
    "400": "Invalid request: the message says what is wrong and how to fix it.",
    "401": "Missing or invalid API key (when the server has one).",
    "415": "The request body is not declared Content-Type: application/json.",
    "404": "Unknown model, or no stored response with that id for this API key.",
    "413": "Request body over the server's --max-body-size.",
    "429": "Queue or compiler busy: retry after the Retry-After header.",
    "500": "Server error.",
    "503": "The engine stopped, too many connections, or the stored responses' database "
    "failed: retry after the Retry-After header.",
}


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """The OpenAI error shape of every error gclm answers."""

    error: ErrorDetail


Bodies = dict[str, tuple[type[BaseModel], type[BaseModel], type[BaseModel]]]


def document(app: FastAPI, bodies: Bodies, served: dict[str, dict[str, Any]]) -> None:
    """Make `app.openapi()` describe `bodies`: POST path -> (request model, response model,
    the model of each streamed event).

    Unknown fields are a 400, so each request body is documented with
    `additionalProperties: false`, whatever the model does to find them. `served`: request
    field -> its schema on this server, where the server accepts less than the model does
    (`model`: the served model's name).
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _add(components, ErrorResponse, "validation")
        for path, (request_model, response_model, chunk_model) in bodies.items():
            operation = schema["paths"][path]["post"]
            _add(components, request_model, "validation", closed=True)
            properties = components[request_model.__name__]["properties"]
            properties.update({k: v for k, v in served.items() if k in properties})
            _add(components, response_model, "serialization")
            _add(components, chunk_model, "serialization")
            event = {
                "type": "object",
                "properties": {
                    "data": {
                        "type": "string",
                        "description": f"JSON: a {chunk_model.__name__}, or an ErrorResponse "
                        'that ends the stream; chat and text completions end with "[DONE]".',
                    }
                },
                "required": ["data"],
            }
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(request_model)}},
            }
            operation["responses"]["200"] = {
                "description": "The completion, or with `stream: true` its Server-Sent Events.",
                "content": {
                    "application/json": {"schema": _ref(response_model)},
                    "text/event-stream": {"schema": event},
                },
            }
        for path, item in schema["paths"].items():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)  # FastAPI's own validation error: never sent
                if path.startswith("/v1/"):
                    for status, description in ERRORS.items():
                        responses.setdefault(
                            status,
                            {
                                "description": description,
                                "content": {"application/json": {"schema": _ref(ErrorResponse)}},
                            },
                        )
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _add(
    components: dict[str, Any], model: type[BaseModel], mode: str, *, closed: bool = False
) -> None:
    schema = model.model_json_schema(ref_template=REF, mode=mode)  # type: ignore[arg-type]
    for name, definition in schema.pop("$defs", {}).items():
        components.setdefault(name, definition)
    if closed:
        schema["additionalProperties"] = False
    components[model.__name__] = schema
