"""Request bodies in /openapi.json for routes that parse their bodies themselves.

Those routes read the raw body so that bad JSON and wrong types answer 400 in the API's own error
shape (FastAPI's body parameters would answer 422); this declares the pydantic model each one
validates against, so clients and schema-driven testers see the real request shape.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


def body_of(model: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route whose JSON body is `model`."""
    ref = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": ref}}}}


def install(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Add the models (and the models they use) to the app's OpenAPI components."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                js = model.model_json_schema(ref_template=_REF)
                components.update(js.pop("$defs", {}))
                components[model.__name__] = js
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
