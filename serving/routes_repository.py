"""Triton's model repository extension: the index of model versions and their state, and
explicit `load` / `unload` (models also load on first use and leave when their folder does)."""

import asyncio

from fastapi import Request
from fastapi.routing import APIRouter

router = APIRouter()


@router.post("/v2/repository/index")
def index(request: Request):
    return request.app.state.repository.index()


@router.post("/v2/repository/models/{name}/load")
async def load(name: str, request: Request):
    """Loads the model's newest version now (a 400 says why it cannot)."""
    await request.app.state.repository.load(name)
    return {}


@router.post("/v2/repository/models/{name}/unload")
async def unload(name: str, request: Request):
    repository = request.app.state.repository
    repository.versions(name)  # a 400/404 for a bad or unknown name
    await asyncio.to_thread(repository.unload, name)
    return {}
