"""The quanto backend: optimum-quanto's packed 2- and 4-bit integers, transformers' `QuantoQuantizedLayer`.

Groups of `q_group_size` channels along `axis_key`/`axis_value` (0 or -1), one scale and one shift each; the
state is quanto's packed tensor subclass, whose `_data` counts as packed and `_scale`/`_shift` as scales
(`QuantBackend.split_state`). Its CPU unpack kernel is prepared once, outside any timed step
(`kvlab.caches.backends.prepare_quanto`), and the run says when the slower pure-PyTorch unpack is used.
"""

from __future__ import annotations

from dataclasses import dataclass

from .registry import register_backend
from .transformers_layers import TransformersBackend


@dataclass(frozen=True)
class QuantoBackend(TransformersBackend):
    """transformers' quanto backend with kvlab's kernel preparation."""

    def prepare(self) -> None:
        from ..backends import prepare_quanto

        prepare_quanto(build=False)

    def runtime_note(self) -> str:
        from ..backends import prepare_quanto

        return prepare_quanto(build=False) or ""


QUANTO = register_backend(QuantoBackend(
    name="quanto", pip="optimum-quanto", package="optimum.quanto", nbits=(2, 4), default_nbits=4, axes=(0, -1),
    layer_name="QuantoQuantizedLayer"))
