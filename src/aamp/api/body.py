"""The base of every request body the API reads: a field it does not know is refused with a
400 naming the field, never accepted and then ignored (`{"resources": {"memory": "1GiB"}}`
must not silently boot a sandbox with the default memory)."""

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
