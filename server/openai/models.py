"""GET /v1/models and /v1/models/{id}: the one served model."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Request

from gclm.errors import ModelNotFoundError
from gclm.server.openai.render import ModelCard, ModelList
from gclm.server.openai.serving import serving_of

router = APIRouter(prefix="/v1")


@router.get("/models")
async def list_models(request: Request) -> ModelList:
    serving = serving_of(request)
    return ModelList(data=[ModelCard(id=serving.engine.model_id, created=serving.started)])


@router.get("/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> ModelCard:
    serving = serving_of(request)
    if model_id != serving.engine.model_id:
        raise ModelNotFoundError(model_id, serving.engine.model_id)
    return ModelCard(id=serving.engine.model_id, created=serving.started)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
