"""Request bodies the server parses itself, declared in /openapi.json, and their error messages.

Endpoints read their JSON by hand (so malformed bodies answer 400 in SGLang's error shape, not
FastAPI's 422); FastAPI then knows nothing of the body, so its pydantic model is declared here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ValidationError

_REF = "#/components/schemas/{model}"


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """A route's `openapi_extra`: its JSON body is `model`."""
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def declare_request_bodies(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add the models' JSON schemas (and the ones they use) to the app's OpenAPI components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = spec.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                schema = model.model_json_schema(ref_template=_REF)
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi


# Tags of "one value or a list" unions (native_protocol.one_or_many): not part of a field's path.
_TAGS = {"one", "many"}


def validation_text(e: ValidationError) -> str:
    """One line naming each bad field (dotted path, list indices included) and what is wrong."""
    parts = []
    for err in e.errors(include_url=False)[:3]:
        loc = ".".join(str(x) for x in err["loc"] if x not in _TAGS)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown sampling parameter" if err["loc"][0] == "sampling_params" else "unknown field"
        elif err["type"] not in ("value_error", "assertion_error") and "input" in err:
            msg += f" (got {repr(err['input'])[:60]})"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts) or "invalid request"
