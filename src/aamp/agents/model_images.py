"""Screenshots shown to a model that takes images (an agent's `browser.images`).

OpenAI-compatible APIs take images only in user messages, so a screenshot follows its tool
result as a user message with one text part and one `image_url` part (a data: URL). Only the
latest screenshot stays in the conversation as an image: earlier ones are replaced by a line
saying so, since every model call re-sends the whole conversation and old pixels would cost
far more than they tell.
"""

from __future__ import annotations

import base64
from typing import Any

from aamp.agents.observation import ModelImage

_MARK = "aamp-screenshot"  # names our image messages, so that only they are ever rewritten


def show_image(messages: list[dict[str, Any]], image: ModelImage, call_id: str) -> None:
    """Append `image` for the tool call `call_id`; earlier screenshots become text."""
    for message in messages:
        if message.get("name") == _MARK and isinstance(message.get("content"), list):
            message["content"] = (
                "[an earlier screenshot was shown here; it is left out now that there is a "
                "newer one]"
            )
    url = f"data:{image.media_type};base64," + base64.b64encode(image.data).decode("ascii")
    messages.append(
        {
            "role": "user",
            "name": _MARK,
            "content": [
                {"type": "text", "text": f"The screenshot taken by browser call {call_id}:"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    )
