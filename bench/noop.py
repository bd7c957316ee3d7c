"""No-op Ray Serve applications: the reference for what Ray Serve alone costs.

    import_path: bench.noop:app       shaped like ours, an ingress and a deployment behind it (two hops; at /noop
                                      in bench/service.py's config)
    import_path: bench.noop:one_hop   the ingress answers itself (one hop; at /noop1): what one hop could save
"""

# No `from __future__ import annotations`: the replica must resolve the body annotation to the
# pydantic model, or FastAPI takes `body` for a query parameter and answers 422.
from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from model import DecodingOptions
from service.schemas import TranslateRequest

api = FastAPI(title="no-op reference")


@serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 0})
class Echo:
    """Stands where a translator stands; does no work."""

    async def translate(self, texts: list[str], options: DecodingOptions) -> list[dict]:
        return [{"text": text, "target_tokens": []} for text in texts]


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class EchoIngress:
    def __init__(self, echo: DeploymentHandle) -> None:
        self.echo = echo

    @api.post("/v1/translate")
    async def translate(self, body: TranslateRequest) -> dict:
        translations = await self.echo.translate.remote(body.texts, body.decoding_options())
        return {"model": "noop", "translations": translations}

    @api.get("/readyz")
    async def readyz(self) -> dict:
        return {"status": "ready"}


app = EchoIngress.bind(Echo.bind())


one_hop_api = FastAPI(title="no-op reference, one hop")


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
@serve.ingress(one_hop_api)
class EchoOneHop:
    """The same body read and the same answer as EchoIngress's, without the call behind it."""

    @one_hop_api.post("/v1/translate")
    async def translate(self, body: TranslateRequest) -> dict:
        body.decoding_options()
        return {"model": "noop", "translations": [{"text": text, "target_tokens": []} for text in body.texts]}

    @one_hop_api.get("/readyz")
    async def readyz(self) -> dict:
        return {"status": "ready"}


one_hop = EchoOneHop.bind()
