"""What one tool call produced, as the agent loop hands it on: text for the model, whether it
worked, facts for the step record, and the browser's screenshot (PNG, for the run's events)
with the image the model is shown, when its agent takes images."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ModelImage:
    media_type: str  # image/png | image/jpeg
    data: bytes


@dataclass
class Observation:
    text: str
    ok: bool = True
    detail: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes | None = None
    model_image: ModelImage | None = None
