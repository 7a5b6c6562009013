"""The "view code" snippets: plain transformers code that reproduces one Compare column with `generate()`
(`code_snippet`), and the same run as a hand-written decode loop, one forward per step (`loop_snippet`, the
Inspect tab's code, with the values of the step on view written beside the lines that compute them).

Pure text: no gradio, no model.
"""

from __future__ import annotations

import json

from kvlab.models.loading import BUNDLED_HUB_ID
from kvlab.strategies.serving import serving_comment


def _model_reference(source: str) -> tuple[str, str]:
    """(expression naming the model for from_pretrained, comment line) for a model source."""
    if source == "bundled":
        return repr(BUNDLED_HUB_ID), (f"# kvlab's bundled model is {BUNDLED_HUB_ID} (from a Q4_1 GGUF, so tokens "
                                      "may differ slightly from the hub weights)")
    return repr(source), ""


def _prompt_lines(prompt_text: str, system: str, chat: bool) -> list[str]:
    """The lines that build `inputs` from the prompt (through the chat template when `chat`)."""
    if not chat:
        text = f"{system.strip()}\n\n{prompt_text}" if system and system.strip() else prompt_text
        return [f"inputs = tokenizer({json.dumps(text, ensure_ascii=False)}, return_tensors=\"pt\")"]
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


def _preamble(strategy, model_source: str, dtype: str, extra_imports: list[str] = ()) -> list[str]:
    """Imports (transformers names merged into one line) and the model and tokenizer lines."""
    imports, _ = strategy.cache_code()
    imports = [*imports, *extra_imports]
    transformers_names = ["AutoModelForCausalLM", "AutoTokenizer"]
    for line in imports:
        if line.startswith("from transformers import "):
            transformers_names += [n.strip() for n in line.removeprefix("from transformers import ").split(",")]
    other_imports = [line for line in imports if not line.startswith("from transformers import ")]
    lines = ["import torch", f"from transformers import {', '.join(dict.fromkeys(transformers_names))}",
             *dict.fromkeys(other_imports), ""]
    model_expr, model_comment = _model_reference(model_source)
    if model_comment:
        lines.append(model_comment)
    lines += [
        f"model_id = {model_expr}",
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        f"model = AutoModelForCausalLM.from_pretrained(model_id, dtype=torch.{dtype})",
        "",
    ]
    return lines


def code_snippet(strategy, settings, prompt_text: str, system: str = "", chat: bool = True,
                 model_source: str = "bundled", dtype: str = "float32") -> str:
    """Plain transformers code that reproduces one column with `model.generate(..., cache=...)`, followed by the
    nearest setting in vLLM, SGLang, TensorRT-LLM and llama.cpp as comments (`kvlab.strategies.serving`).

    Args:
        strategy: a `kvlab.strategies.Strategy` (its `cache_code()` and `generate_kwargs_code()`).
        settings: the `GenerationSettings` of the run.
        prompt_text, system, chat: the prompt as the page had it.
        model_source: `bundled`, a hub id or a local folder; dtype: a `kvlab.models.loading.DTYPES` name.
    """
    if strategy.engine_name:
        return engine_snippet(strategy, settings, prompt_text, system, chat, model_source)
    # 1. Imports, the model and tokenizer.
    context_imports, context = strategy.generate_context_code()
    lines = _preamble(strategy, model_source, dtype, context_imports)
    # 2. The prompt, the cache and the generate call.
    lines += _prompt_lines(prompt_text, system, chat)
    lines.append(f"max_new_tokens = {settings.max_new_tokens}")
    _, cache_line = strategy.cache_code()
    if cache_line:
        lines.append(cache_line)
    indent = "    " if context else ""
    call = f",\n{indent}    ".join(_generate_kwargs(strategy, settings, lines))
    lines += [
        *([context] if context else []),
        f"{indent}out = model.generate(\n{indent}    {call},\n{indent})",
        "print(tokenizer.decode(out[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))",
        *serving_comment(strategy),  # 3. The nearest vLLM / SGLang / TensorRT-LLM / llama.cpp setting.
    ]
    return "\n".join(lines) + "\n"


def engine_snippet(strategy, settings, prompt_text: str, system: str = "", chat: bool = True,
                   model_source: str = "bundled") -> str:
    """The code that reproduces an engine column with its engine's own Python client: the prompt's token ids from
    the model's tokenizer (as kvlab's columns see them), then the engine's lines (`EngineColumn.engine_code`)."""
    imports, engine_lines = strategy.engine_code(settings, model_source)
    model_expr, model_comment = _model_reference(model_source)
    lines = ["from transformers import AutoTokenizer", *imports, ""]
    lines += [model_comment] if model_comment else []
    lines += [f"tokenizer = AutoTokenizer.from_pretrained({model_expr})", *_prompt_lines(prompt_text, system, chat)]
    lines.append("prompt_ids = inputs[\"input_ids\"][0].tolist()")
    lines += [f"max_new_tokens = {settings.max_new_tokens}", *engine_lines]
    return "\n".join(lines) + "\n"


LOOP_VALUES = ("input_ids", "past", "cache_position", "position_ids", "mask", "next_token")
"""The loop lines `loop_snippet` can annotate with a step's values, by key."""


def loop_snippet(strategy, settings, prompt_text: str, system: str = "", chat: bool = True,
                 model_source: str = "bundled", dtype: str = "float32", values: dict[str, str] | None = None) -> str:
    """The column's run as a hand-written greedy decode loop in plain transformers: prefill, then one forward
    per token through the strategy's cache, as kvlab's engine runs it (`Strategy.forward_code`).

    Args:
        strategy, settings, prompt_text, system, chat, model_source, dtype: as `code_snippet`.
        values: LOOP_VALUES key -> the value that line has at the step on view; written as a `# ←` comment.
    """
    values = values or {}
    imports, forward_lines = strategy.forward_code()

    def noted(line: str, key: str) -> str:
        return f"{line}  # ← {values[key]}" if key in values else line

    # 1. Imports, the model and tokenizer, the prompt and the cache.
    lines = _preamble(strategy, model_source, dtype, imports) + _prompt_lines(prompt_text, system, chat)
    lines.append(f"max_new_tokens = {settings.max_new_tokens}")
    _, cache_line = strategy.cache_code()
    if cache_line:
        lines.append(cache_line)
    # 2. The loop: what the step feeds, its positions, the forward, the token choice.
    lines += ["", "sequence = inputs[\"input_ids\"]  # (1, prompt tokens)",
              "input_ids = sequence  # the first step feeds the prompt, each later step the token chosen before",
              "for step in range(max_new_tokens):", noted("    # input_ids this step", "input_ids")]
    own_positions = any(line.startswith("position_ids =") for line in forward_lines)  # e.g. a pruned cache's
    if strategy.use_cache:
        lines += [noted("    past = cache.get_seq_length()  # tokens the cache counts before this step", "past"),
                  noted("    cache_position = torch.arange(past, past + input_ids.shape[1])  # slots written "
                        "(transformers 5 keeps this inside the cache)", "cache_position")]
        if not own_positions:
            lines.append(noted("    position_ids = cache_position[None]", "position_ids"))
    elif not own_positions:
        lines.append(noted("    position_ids = torch.arange(sequence.shape[1])[None]", "position_ids"))
    lines.append("    with torch.inference_mode():")
    lines += [f"        {noted(line, 'position_ids') if line.startswith('position_ids =') else line}"
              for line in forward_lines]
    lines += [noted("    # the model builds the causal mask from cache.get_mask_sizes", "mask"),
              noted("    next_token = int(out.logits[0, -1].argmax())", "next_token")]
    if settings.stop_at_eos:
        lines += ["    if next_token == tokenizer.eos_token_id:", "        break"]
    lines += ["    input_ids = torch.tensor([[next_token]])",
              "    sequence = torch.cat([sequence, input_ids], dim=1)",
              "print(tokenizer.decode(sequence[0, inputs[\"input_ids\"].shape[1]:], skip_special_tokens=True))"]
    return "\n".join(lines) + "\n"
