"""The "view code" snippet: plain transformers code that reproduces one Compare column.

Pure text: no gradio, no model.
"""

from __future__ import annotations

import json

from kvlab.models import BUNDLED_HUB_ID


def _model_reference(source: str) -> tuple[str, str]:
    """(expression naming the model for from_pretrained, comment line) for a model source."""
    if source == "bundled":
        return repr(BUNDLED_HUB_ID), (f"# kvlab's bundled model is {BUNDLED_HUB_ID} (from a Q4_1 GGUF, so tokens "
                                      "may differ slightly from the hub weights)")
    return repr(source), ""


def _prompt_lines(prompt_text: str, system: str, chat: bool) -> list[str]:
    """The lines that build `inputs` from the prompt (through the chat template when `chat`)."""
    if not chat:
        return [f"inputs = tokenizer({json.dumps(prompt_text, ensure_ascii=False)}, return_tensors=\"pt\")"]
    messages = ([{"role": "system", "content": system}] if system.strip() else []) + [
        {"role": "user", "content": prompt_text}]
    return [
        f"messages = {json.dumps(messages, ensure_ascii=False)}",
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", "
        "return_dict=True)",
    ]


def _generate_kwargs(strategy, settings, lines: list[str]) -> list[str]:
    """The `generate()` keyword arguments for `settings`; appends the seed line to `lines` when sampling."""
    kwargs = ["**inputs", "max_new_tokens=max_new_tokens"]
    if settings.do_sample:
        lines.append(f"torch.manual_seed({settings.seed})")
        kwargs += ["do_sample=True", f"temperature={settings.temperature}", f"top_p={settings.top_p}",
                   f"top_k={settings.top_k}"]
    else:
        kwargs.append("do_sample=False")
    if settings.repetition_penalty != 1.0:
        kwargs.append(f"repetition_penalty={settings.repetition_penalty}")
    if not settings.stop_at_eos:
        kwargs.append("eos_token_id=None")
    kwargs.append(strategy.generate_kwargs_code())
    return kwargs


def code_snippet(strategy, settings, prompt_text: str, system: str = "", chat: bool = True,
                 model_source: str = "bundled", dtype: str = "float32") -> str:
    """Plain transformers code that reproduces one column with `model.generate(..., cache=...)`.

    Args:
        strategy: a `kvlab.strategies.Strategy` (its `cache_code()` and `generate_kwargs_code()`).
        settings: the `GenerationSettings` of the run.
        prompt_text, system, chat: the prompt as the page had it.
        model_source: `bundled`, a hub id or a local folder; dtype: a `kvlab.models.DTYPES` name.
    """
    # 1. Imports: transformers names merged into one line, the strategy's other imports after it.
    imports, cache_line = strategy.cache_code()
    transformers_names = ["AutoModelForCausalLM", "AutoTokenizer"]
    for line in imports:
        if line.startswith("from transformers import "):
            transformers_names += [n.strip() for n in line.removeprefix("from transformers import ").split(",")]
    other_imports = [line for line in imports if not line.startswith("from transformers import ")]
    lines = ["import torch", f"from transformers import {', '.join(dict.fromkeys(transformers_names))}",
             *other_imports, ""]
    # 2. The model and tokenizer.
    model_expr, model_comment = _model_reference(model_source)
    if model_comment:
        lines.append(model_comment)
    lines += [
        f"model_id = {model_expr}",
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        f"model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch.{dtype})",
        "",
    ]
    # 3. The prompt, the cache and the generate call.
    lines += _prompt_lines(prompt_text, system, chat)
    lines.append(f"max_new_tokens = {settings.max_new_tokens}")
    if cache_line:
        lines.append(cache_line)
    call = ",\n    ".join(_generate_kwargs(strategy, settings, lines))
    lines += [
        f"out = model.generate(\n    {call},\n)",
        "print(tokenizer.decode(out[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))",
    ]
    return "\n".join(lines) + "\n"
