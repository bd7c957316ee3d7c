"""The application's configuration, the one owner of the service's defaults: `ServiceConfig` validates the `args`
of the Ray Serve application (deploy/serve.yaml). Models load only from the locations listed here.
"""

from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MODEL_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class ModelSpec(BaseModel):
    """One served model: its public id, where its Marian directory lives and its language pair."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=MODEL_ID_PATTERN, description="Public model id, used in requests and explanation ids.")
    path: str = Field(
        description="A Marian model directory (absolute, or relative to the replica's working directory; "
        "$VARS and ~ are expanded), or the name of a model shipped in model/pretrained/."
    )
    source_lang: str = Field(pattern=r"^[A-Za-z-]{2,16}$")
    target_lang: str = Field(pattern=r"^[A-Za-z-]{2,16}$")
    dtype: str = Field(
        "auto",
        pattern=r"^(auto|float32|bfloat16|float16|int8)$",
        description="How the model decodes. auto: int8 on a CPU (float32 where the compiled runtime cannot be "
        "built), float32 on a GPU. int8 (CPU only): int8 decoding, explanations from the fp32 weights. float32: "
        "exact reference decoding.",
    )

    @property
    def expanded_path(self) -> str:
        return os.path.expanduser(os.path.expandvars(self.path))


DEFAULT_MODELS = [
    ModelSpec(id="en-zh", path="en-zh", source_lang="en", target_lang="zh"),
    ModelSpec(id="zh-en", path="zh-en", source_lang="zh", target_lang="en"),
]


class DocumentsConfig(BaseModel):
    """Document translation (DeepL's /v2/document, LibreTranslate's /translate_file): the jobs and their files live
    in the store (store_url), for how long, and the limits."""

    model_config = ConfigDict(extra="forbid")

    queue: str = Field(
        "documents",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="The name of this deployment's document queue in the store: deployments that share a store "
        "take only their own queue's jobs.",
    )
    retention_s: float = Field(
        3600, gt=0, description="A finished (or failed) document is deleted this long after, if not downloaded."
    )
    max_file_bytes: int = Field(10 * 2**20, ge=1024, le=2**30, description="Larger uploads answer 413.")
    max_characters: int = Field(
        1_000_000, ge=1, description="A document with more characters of text answers 413 on upload."
    )
    workers_per_replica: int = Field(
        2, ge=0, le=64, description="Documents one ingress replica translates at once (0: this replica takes none)."
    )
    lease_s: float = Field(
        60, ge=5, le=3600, description="A job whose replica stops renewing it for this long is taken by another."
    )
    max_attempts: int = Field(3, ge=1, le=100, description="Times a job is taken before it is given up as error.")
    poll_s: float = Field(1.0, gt=0, le=60, description="How often an idle worker looks for queued jobs.")



class ServiceConfig(BaseModel):
    """Everything deploy/serve.yaml may set under the application's `args`."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelSpec] = Field(default_factory=lambda: [m.model_copy() for m in DEFAULT_MODELS], min_length=1)
    max_batch_size: int = Field(
        16,
        ge=1,
        le=256,
        description="static: texts that join the decode loop together; both: texts aligned and assessed together "
        "after their decodes (service/batching.py).",
    )
    batch_wait_timeout_s: float = Field(
        0.01,
        ge=0,
        le=10,
        description="static: how long a batch that is not full waits for more texts before it joins the loop (not "
        "right after a batch of one text: at light load a lone request starts at once).",
    )
    scheduler: Literal["static", "continuous"] = Field(
        "static",
        description='The policy of each replica\'s one decode loop (model/decoding/scheduler.py). "static": a batch '
        "of texts joins only when the loop is empty and decodes to its end. \"continuous\": texts join and leave "
        "at every step; batch_wait_timeout_s does not apply and the ingress does not hold calls back "
        "(coalesce_max_calls is ignored). Tokens stream under both.",
    )
    max_rows: int = Field(
        64, ge=1, le=4096, description="Decoder rows in flight per replica (a beam of k takes k rows)."
    )
    layout: Literal["per_model", "colocated"] = Field(
        "per_model",
        description='Where the models run. "per_model": one translator deployment per model (translator-<id>), '
        "called by the ingress through Ray: two hops a request, each model scaled on its own. \"colocated\": "
        "every model loads in each Ingress replica and its routes call them in-process: one hop a request, the "
        "models scaled together with the Ingress (its deployment's only entry in `deployments`; give it the "
        "CPUs the translators had).",
    )
    coalesce_max_calls: int = Field(
        2,
        ge=0,
        le=1024,
        description="Translate calls one ingress replica keeps out per model; requests arriving meanwhile leave "
        "together in the next call (service/coalescing.py). 0: every request is its own call.",
    )
    request_timeout_s: float = Field(30.0, gt=0, le=600, description="A model call slower than this answers 504.")
    max_in_flight_requests: int = Field(
        128, ge=0, description="Model calls one ingress replica runs at once; more answer 503 with Retry-After."
    )
    retry_after_s: int = Field(1, ge=0, le=3600, description="The Retry-After header sent with 503.")
    max_body_bytes: int = Field(1_000_000, ge=1024, description="Larger request bodies answer 413.")
    api_keys: list[str] = Field(default_factory=list, description="Accepted API keys (prefer api_keys_env).")
    api_keys_env: str = Field("TRANSLATE_API_KEYS", description="Environment variable with comma-separated API keys.")
    protect_operational_routes: bool = Field(
        False, description="Also require an API key on /healthz, /readyz and /metrics."
    )
    cors_origins: list[str] = Field(default_factory=list, description="Allowed CORS origins; none by default.")
    explanation_secret_env: str = Field(
        "TRANSLATE_EXPLANATION_SECRET",
        description="Environment variable holding the key that signs explanation ids (same on every replica).",
    )
    store_url: str = Field(
        "sqlite:///~/.local/state/attention-translate/state.db",
        description="Where glossaries live, shared by every replica: sqlite:////absolute/path, "
        "sqlite:///relative/path or sqlite:///~/path (one machine; ~ is the replica's home), or "
        "postgresql://user@host:port/database (a cluster; a password goes in store_url_env's URL, not here).",
    )
    store_url_env: str = Field(
        "TRANSLATE_STORE_URL", description="Environment variable whose URL, when set, replaces store_url."
    )
    documents: DocumentsConfig = Field(default_factory=DocumentsConfig)
    metrics_dir: str | None = Field(
        None,
        description="prometheus_client multiprocess directory shared by the replicas of one node; node-local "
        "(unset: one per Ray node under the temp dir), never on storage that several nodes share.",
    )
    node_metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="On a multi-node cluster: each node's ingress replica also serves that node's metrics at "
        "http://<node address>:<port>/metrics, a per-node Prometheus target (deploy/prometheus.yml). "
        "Unset: only GET /metrics, which answers for the node of whichever ingress replica serves it.",
    )

    @field_validator("api_keys")
    @classmethod
    def _no_empty_keys(cls, keys: list[str]) -> list[str]:
        if any(not key for key in keys):
            raise ValueError("api_keys must not contain empty strings")
        return keys

    @model_validator(mode="after")
    def _unique_ids(self) -> ServiceConfig:
        ids = [m.id for m in self.models]
        if len(set(ids)) != len(ids):
            raise ValueError(f"model ids must be unique, got {ids}")
        return self

    def resolved_store_url(self) -> str:
        """store_url, or the URL in the store_url_env environment variable when that is set."""
        return os.environ.get(self.store_url_env, "").strip() or self.store_url

    def deployment_names(self) -> list[str]:
        """The Serve deployments the application builds: the Ingress, and in the per_model layout a translator per
        model."""
        translators = [translator_deployment_name(m.id) for m in self.models] if self.layout == "per_model" else []
        return ["Ingress", *translators]

    def resolved_api_keys(self) -> list[str]:
        """Keys from the config plus those in the api_keys_env environment variable."""
        from_env = [key.strip() for key in re.split(r"[,\s]+", os.environ.get(self.api_keys_env, "")) if key.strip()]
        return [*self.api_keys, *from_env]


# Explanation ids are integrity-checked with this key unless a deployment sets its own.
# A forged id can only request a forced decode of chosen ids, which /v1/explain allows anyway.
DEFAULT_EXPLANATION_SECRET = "attention-translate/explanations/v1"


def explanation_secret(environment_variable: str) -> bytes:
    """The key signing explanation ids, read in each replica from its environment."""
    return os.environ.get(environment_variable, DEFAULT_EXPLANATION_SECRET).encode("utf-8")


def translator_arguments(config: ServiceConfig) -> dict[str, dict]:
    """By model id, what its translator is built with: the spec, the decode loop's settings, and the model
    translating the other way, if one is served (for the agreed alignment)."""

    def reverse_of(spec: ModelSpec) -> dict | None:
        pairs = [m for m in config.models if (m.source_lang, m.target_lang) == (spec.target_lang, spec.source_lang)]
        return pairs[0].model_dump() if pairs else None

    return {
        spec.id: {
            "spec": spec.model_dump(),
            "max_batch_size": config.max_batch_size,
            "batch_wait_timeout_s": config.batch_wait_timeout_s,
            "explanation_secret_env": config.explanation_secret_env,
            "metrics_dir": config.metrics_dir,
            "scheduler": config.scheduler,
            "max_rows": config.max_rows,
            "reverse_spec": reverse_of(spec),
        }
        for spec in config.models
    }


def translator_deployment_name(model_id: str) -> str:
    """The Ray Serve deployment name of a model's translator, as deploy/serve.yaml refers to it."""
    return f"translator-{model_id}"
