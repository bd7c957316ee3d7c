"""/docs without a CDN: Swagger UI's files ship in the fastapi-offline package and the service serves them itself.

FastAPI's own /docs page loads Swagger UI from a CDN and stays blank offline; the app is built with
docs_url=None and `add_offline_docs(api)` puts back the same page, pointing at the local copies.
"""

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

SWAGGER_UI_DIR = files("fastapi_offline") / "static"  # swagger-ui-bundle.js, swagger-ui.css, favicon.png
ASSETS_PATH = "/static/swagger-ui"  # below /static/: public like the viewer's files when API keys are on


def add_offline_docs(api: FastAPI, docs_path: str = "/docs") -> None:
    """Serve Swagger UI's assets under ASSETS_PATH and a `docs_path` page that loads nothing else."""
    api.mount(ASSETS_PATH, StaticFiles(directory=str(SWAGGER_UI_DIR)), name="swagger-ui")

    @api.get(docs_path, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")  # the application's route prefix under Serve
        return get_swagger_ui_html(
            openapi_url=root + api.openapi_url,
            title=f"{api.title} — API docs",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # the online validator badge would call out
        )
