from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from services.console.service import ConsoleService


async def get_service(request: Request) -> ConsoleService:
    return request.app.state.service


Service = Annotated[ConsoleService, Depends(get_service)]
