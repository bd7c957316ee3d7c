"""/docs and /redoc without a CDN: Swagger UI's and ReDoc's files ship in the fastapi-offline package and the
service serves them itself (FastAPI's own pages load them from a CDN and stay blank offline).
"""

from importlib.resources import files

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

SWAGGER_UI_DIR = files("fastapi_offline") / "static"  # swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js
ASSETS_PATH = "/static/swagger-ui"  # below /static/: public like the viewer's files when API keys are on
REDOC_POLICY = (
    "default-src 'self'; img-src 'self' data:; font-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "worker-src 'self' blob:"
)


def add_offline_docs(api: FastAPI, docs_path: str = "/docs", redoc_path: str = "/redoc") -> None:
    """Serve the assets under ASSETS_PATH, and `docs_path` (Swagger UI) and `redoc_path` (ReDoc) pages that load
    nothing else."""
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

    @api.get(redoc_path, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        page = get_redoc_html(
            openapi_url=root + api.openapi_url,
            title=f"{api.title} — API reference",
            redoc_js_url=f"{root}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
        # ReDoc's bundle still links its maker's logo from a CDN: the browser may load nothing but this service
        page.headers["Content-Security-Policy"] = REDOC_POLICY
        return page
