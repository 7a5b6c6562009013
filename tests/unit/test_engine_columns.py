"""Engine columns without an engine: their syntax, knobs and messages, where they are offered, the key never
shown, llama.cpp's rotation switch, and the `/metrics` reading."""

import os

import pytest

from kvlab.columns import Column
from kvlab.engines.gguf import gguf_refusal
from kvlab.engines.llamacpp import ROT_ENV, _rotation, context_size, rotated, sampling
from kvlab.engines.metrics import MetricsError, figures_line, parse_metrics, server_figures
from kvlab.engines.openai import endpoint_refusal, metrics_url, request_body, shown_url
from kvlab.generation import GenerationSettings
from kvlab.strategies import ENGINE_COLUMNS, STRATEGIES, StrategyError, make_strategy
from kvlab.strategies.base import parse_strategy_item
from kvlab.ui.shared.knobs import column_spec, plan_columns, strategy_choices

URL = "http://127.0.0.1:8080/v1"


def test_an_engine_column_is_two_parts_and_a_url_keeps_its_colons():
    spec = parse_strategy_item(f"engine:openai:base_url={URL}:model=smol:send=ids")
    assert spec == {"strategy": "engine:openai", "base_url": URL, "model": "smol", "send": "ids"}
    assert parse_strategy_item("engine:llamacpp:type_k=q4_0:type_v=q4_0") == {
        "strategy": "engine:llamacpp", "type_k": "q4_0", "type_v": "q4_0"}
    assert parse_strategy_item("engine:llamacpp") == {"strategy": "engine:llamacpp"}
    assert parse_strategy_item("quantized:backend=hqq:nbits=4") == {"strategy": "quantized", "backend": "hqq",
                                                                     "nbits": 4}
    with pytest.raises(ValueError, match="write key=value"):
        parse_strategy_item("sink:window")


def test_engine_columns_are_compare_columns_only():
    assert set(ENGINE_COLUMNS) == {"engine:llamacpp", "engine:openai"} and not set(ENGINE_COLUMNS) & set(STRATEGIES)
    compare = [value for _, value in strategy_choices(None, engines=True)]
    assert "engine:llamacpp" in compare and "engine:openai" in compare
    assert not {value for _, value in strategy_choices(None)} & set(ENGINE_COLUMNS)
    assert not {value for _, value in strategy_choices(None, "usable_in_chat")} & set(ENGINE_COLUMNS)
    column = make_strategy({"strategy": "engine:llamacpp"})
    with pytest.raises(StrategyError, match="^engine:llamacpp runs a serving engine.*Compare column only$"):
        column.build_cache(None, 16)
    with pytest.raises(StrategyError, match="unknown strategy 'engine:vllm'.*engine columns \\(Compare\\): "
                                            "engine:llamacpp, engine:openai"):
        make_strategy({"strategy": "engine:vllm"})


@pytest.mark.parametrize("item, message", [
    ("engine:llamacpp:type_k=q3_k", "type_k must be one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, "
                                    "got 'q3_k'"),
    ("engine:llamacpp:type_v=q4_0:flash_attn=false", "type_v=q4_0 needs flash_attn=true: llama.cpp quantizes V "
                                                     "only with flash attention"),
    ("engine:llamacpp:rotation=maybe", "rotation must be true or false, got 'maybe'"),
    ("engine:llamacpp:n_threads=0", "n_threads must be an integer 1..256, got 0"),
    ("engine:openai", "base_url must be the server's http(s) API root, e.g. http://127.0.0.1:8080/v1"),
    ("engine:openai:base_url=ftp://host/v1", "base_url must be the server's http(s) API root"),
    (f"engine:openai:base_url={URL}:send=bytes", "send must be one of text, ids, got 'bytes'"),
    (f"engine:openai:base_url={URL}:timeout_s=0", "timeout_s must be a number of seconds in (0, 600], got 0"),
    ("engine:llamacpp:type=q4_0", "engine:llamacpp: unknown setting(s) ['type']"),
])
def test_a_bad_knob_is_one_line_in_its_own_column(item, message):
    column = Column.from_text(item)
    assert column.strategy is None and column.title == item
    assert column.rejected.startswith(message) and "\n" not in column.rejected


def test_names_say_the_cache_types_and_the_server():
    assert make_strategy({"strategy": "engine:llamacpp"}).describe() == "engine:llamacpp f16"
    assert make_strategy({"strategy": "engine:llamacpp", "type_k": "q4_0", "type_v": "q4_0"}).describe() == \
        "engine:llamacpp q4_0"
    assert make_strategy({"strategy": "engine:llamacpp", "type_k": "q8_0", "type_v": "q4_0", "rotation": False}
                         ).describe() == "engine:llamacpp K q8_0 V q4_0 rotation=false"
    server = make_strategy({"strategy": "engine:openai", "base_url": URL, "model": "smol", "send": "ids"})
    assert server.describe() == "engine:openai smol @ 127.0.0.1:8080 send=ids"


def test_the_api_key_is_never_shown():
    key = "sk-kvlab-test-0123456789"
    column = Column.from_text(f"engine:openai:base_url=http://user:pw@127.0.0.1:8080/v1:api_key={key}")
    shown = " ".join([column.describe(), repr(column.strategy), str(column.strategy.knobs())])
    assert key not in shown and "pw" not in column.describe()
    assert column.strategy.knobs()["api_key"] == "(set)" and column.strategy.api_key == key
    assert shown_url("http://user:pw@127.0.0.1:8080/v1") == "http://127.0.0.1:8080/v1"


def test_the_compare_form_builds_engine_columns_from_cards():
    valid, errors = plan_columns([("engine:llamacpp", ["q4_0", "q4_0", "", "", ""]),
                                  ("engine:openai", ["", "", "", "", "", ""])])
    assert [strategy.describe() for _, strategy in valid] == ["engine:llamacpp q4_0"]
    assert errors[1].startswith("base_url must be")
    assert column_spec("engine:llamacpp", ["q8_0", "", "false"]) == {"strategy": "engine:llamacpp", "type_k": "q8_0",
                                                                     "flash_attn": False}


def test_a_model_without_gguf_is_refused_in_one_line():
    assert gguf_refusal("bundled") is None and gguf_refusal("bundled:gemma-3-270m") is None
    assert gguf_refusal("/models/smol.Q4_0.gguf") is None
    line = gguf_refusal("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert line.startswith("needs the model as a GGUF file, and 'HuggingFaceTB/SmolLM2-135M-Instruct' has none")
    assert "\n" not in line


def test_rotation_is_llamas_rule_and_its_switch_is_restored(monkeypatch):
    assert rotated("q4_0", 64, True) and rotated("q8_0", 256, True)
    assert not rotated("f16", 64, True) and not rotated("q4_0", 64, False) and not rotated("q4_0", 80, True)
    monkeypatch.setenv(ROT_ENV, "7")
    with _rotation(False):
        assert os.environ[ROT_ENV] == "1"
    assert os.environ[ROT_ENV] == "7"
    with pytest.raises(RuntimeError):
        with _rotation(True):
            assert ROT_ENV not in os.environ
            raise RuntimeError("a failing context build")
    assert os.environ[ROT_ENV] == "7"


def test_sampling_and_request_follow_the_generation_settings():
    greedy = GenerationSettings(max_new_tokens=8)
    assert sampling(greedy) == {"repeat_penalty": 1.0, "temp": 0.0}
    sampled = GenerationSettings(max_new_tokens=8, do_sample=True, temperature=0.7, top_k=20, top_p=0.9, seed=3,
                                 stop_at_eos=False)
    assert sampling(sampled) == {"repeat_penalty": 1.0, "temp": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.0,
                                 "typical_p": 1.0}
    body = request_body("m", [1, 2], sampled)
    assert body["prompt"] == [1, 2] and body["stream"] and body["ignore_eos"] and body["top_k"] == 20
    assert request_body("m", "hi", greedy)["temperature"] == 0.0 and "ignore_eos" not in request_body("m", "", greedy)
    assert context_size(1) == 256 and context_size(257) == 512


def test_endpoints_are_off_on_a_public_server_unless_allowed(monkeypatch):
    monkeypatch.delenv("KVLAB_ALLOW_ENDPOINTS", raising=False)
    monkeypatch.setenv("KVLAB_PUBLIC", "0")
    assert endpoint_refusal() is None
    monkeypatch.setenv("KVLAB_PUBLIC", "1")
    assert endpoint_refusal().startswith("endpoint columns are off on this server (KVLAB_ALLOW_ENDPOINTS=1")
    monkeypatch.setenv("KVLAB_ALLOW_ENDPOINTS", "1")
    assert endpoint_refusal() is None
    monkeypatch.setenv("KVLAB_PUBLIC", "0")
    monkeypatch.setenv("KVLAB_ALLOW_ENDPOINTS", "0")
    assert endpoint_refusal() is not None


VLLM_PAGE = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="smol"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="smol"} 120.0
vllm:prefix_cache_hits_total{engine="0",model_name="smol"} 48.0
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="smol"} 3.0
"""
LLAMA_PAGE = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 30
llamacpp:prompt_tokens_cached_total 10
llamacpp:requests_processing 1
"""


def test_metrics_pages_of_vllm_and_llama_server_are_read():
    before = parse_metrics(VLLM_PAGE)
    assert before["vllm:kv_cache_usage_perc"] == [({"engine": "0", "model_name": "smol"}, 0.25)]
    after = parse_metrics(VLLM_PAGE.replace("120.0", "180.0").replace("48.0", "90.0"))
    figures = server_figures(before, None, after)
    assert figures["kv_cache_usage"] == 0.25 and (figures["prefix_cache_hits"], figures["prefix_cache_queries"]) == (
        42.0, 60.0)
    assert figures_line(figures) == "server: KV cache 25.0% used · prefix cache 42 of 60 prompt tokens hit"
    llama_before, llama_after = parse_metrics(LLAMA_PAGE), parse_metrics(LLAMA_PAGE.replace(" 30", " 50")
                                                                         .replace(" 10", " 25"))
    figures = server_figures(llama_before, None, llama_after)
    assert (figures["prefix_cache_hits"], figures["prefix_cache_queries"]) == (15.0, 35.0)
    assert "kv_cache_usage" not in figures
    assert figures_line(server_figures({}, None, {})) == ""


def test_a_page_that_is_not_prometheus_text_is_one_line():
    with pytest.raises(MetricsError, match="^line 2 is not a Prometheus sample: '<html>'$"):
        parse_metrics("# ok\n<html>\n")
    with pytest.raises(MetricsError, match="^line 1: 'many' is not a number$"):
        parse_metrics("vllm:kv_cache_usage_perc many\n")
    assert metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000/api/v1/") == "http://h:8000/api/metrics"


def test_view_code_reproduces_an_engine_column_with_its_own_client():
    from kvlab.ui.shared.code import code_snippet

    settings = GenerationSettings(max_new_tokens=16)
    llama = code_snippet(make_strategy({"strategy": "engine:llamacpp", "type_k": "q8_0", "type_v": "q4_0",
                                        "rotation": False}), settings, "Why?", "Be brief.")
    compile(llama, "llama.py", "exec")
    assert "type_k=llama_cpp.GGML_TYPE_Q8_0, type_v=llama_cpp.GGML_TYPE_Q4_0, flash_attn=True" in llama
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in llama and 'os.environ["LLAMA_ATTN_ROT_DISABLE"] = "1"' in llama
    assert "llm.create_completion(prompt_ids, max_tokens=max_new_tokens, temperature=0.0)" in llama
    key = "sk-kvlab-snippet-secret"
    server = code_snippet(make_strategy({"strategy": "engine:openai", "base_url": URL, "model": "smol",
                                         "api_key": key, "send": "ids"}), settings, "Why?")
    compile(server, "server.py", "exec")
    assert key not in server and 'api_key=os.environ["OPENAI_API_KEY"]' in server
    assert "client.completions.create(model='smol', prompt=prompt_ids," in server


def test_an_engine_columns_divergence_says_why_it_has_no_inspect_link():
    from kvlab.ui.shared.inspect_links import links_for

    items = [(make_strategy({"strategy": "dynamic"}), 2), (make_strategy({"strategy": "engine:llamacpp"}), 2)]
    links, reasons = links_for(items, prompt="Hi", system="", chat=True, greedy=True, max_new_tokens=8,
                               model="bundled")
    assert 0 in links and 1 not in links
    assert reasons[1] == "llama.cpp runs outside transformers: Inspect steps kvlab's own caches"
