"""Tests for fl_lightning.synthesis.prompts: template and LLM expanders, the JSON cache."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json
from pathlib import Path

import pytest
import torch

from fl_lightning.errors import MissingResourceError
from fl_lightning.synthesis.prompts import (
    QUESTION,
    LLMPromptExpander,
    TemplatePromptExpander,
    _first_sentence,
    _mentions,
    expand_with_cache,
)


def test_question_is_the_papers():
    assert QUESTION.format(label="zebra") == (
        'Write a sentence using the word "zebra" to describe the characteristics and actions of the object.'
    )


def test_template_expander_is_varied_deterministic_and_per_label():
    labels = ["cat", "apple_pie", "sea turtle"]
    a = TemplatePromptExpander(seed=0).expand(labels, 40)
    assert a == TemplatePromptExpander(seed=0).expand(labels, 40)
    assert a != TemplatePromptExpander(seed=1).expand(labels, 40)
    assert a["cat"] == TemplatePromptExpander(seed=0).expand(["cat"], 40)["cat"]  # independent of other labels
    for label, prompts in a.items():
        assert len(prompts) == 40 and len(set(prompts)) == 40
        assert all(_mentions(p, label) for p in prompts)
    assert "apple pie" in a["apple_pie"][0]
    # the whole template space is used before anything repeats
    many = TemplatePromptExpander(seed=0).prompts_for("cat", 961)
    assert len(set(many[:960])) == 960 and many[960] == many[0]


def test_first_sentence_and_label_check():
    assert _first_sentence('  "The zebra runs fast. It is striped."\n more') == "The zebra runs fast."
    assert _first_sentence("a zebra\nwith   stripes") == "a zebra with stripes"
    assert _first_sentence("Version 2.5 of the zebra! yes") == "Version 2.5 of the zebra!"
    assert _mentions("An Apple Pie on a plate.", "apple_pie")
    assert not _mentions("zebras everywhere.", "zebra")


def _tiny_llm(path):
    """A tiny random GPT-2 with a word-level tokenizer whose only real word is 'zebra'."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "[EOS]": 1, "[PAD]": 2, "zebra": 3, "runs": 4, ".": 5}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]", pad_token="[PAD]")
    fast.save_pretrained(path)
    cfg = GPT2Config(vocab_size=len(vocab), n_embd=16, n_layer=1, n_head=2, n_positions=64, eos_token_id=1, bos_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_llm(tmp_path_factory):
    return _tiny_llm(tmp_path_factory.mktemp("llm"))


def test_llm_expander_keeps_labelled_sentences_and_falls_back(tiny_llm):
    state = torch.get_rng_state()
    exp = LLMPromptExpander(tiny_llm, max_new_tokens=8, seed=0)
    out = exp.expand(["zebra", "yak"], 4)
    assert torch.equal(torch.get_rng_state(), state)  # sampling does not disturb the caller's RNG
    assert out == LLMPromptExpander(tiny_llm, max_new_tokens=8, seed=0).expand(["zebra", "yak"], 4)
    templates = TemplatePromptExpander(seed=0)
    for label in ("zebra", "yak"):
        assert len(out[label]) == 4 and len(set(out[label])) == 4
        assert all(_mentions(p, label) for p in out[label])
    # 'yak' is outside the model's vocabulary: every answer fails the check → template sentences
    assert out["yak"] == templates.prompts_for("yak", 4)
    # 'zebra' is what the model mostly says: some prompts come from the model itself
    assert any(p not in templates.prompts_for("zebra", 960) for p in out["zebra"])


def test_llm_missing_path_is_one_clear_line(tmp_path):
    with pytest.raises(MissingResourceError) as err:
        LLMPromptExpander(tmp_path / "llama-7b")
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "llama-7b") in msg and "fedisyn.llm_path" in msg
    (tmp_path / "empty").mkdir()
    empty = LLMPromptExpander(tmp_path / "empty")  # a folder: what it holds is read at the first expansion
    with pytest.raises(MissingResourceError) as err:
        empty.expand(["zebra"], 1)
    msg = str(err.value)
    assert "\n" not in msg and str(tmp_path / "empty") in msg and "fedisyn.llm_path" in msg


@pytest.fixture
def llm_loads(monkeypatch):
    """The folders ``AutoModelForCausalLM.from_pretrained`` loaded a model from, in order (it still loads)."""
    from transformers import AutoModelForCausalLM

    loads = []
    load = AutoModelForCausalLM.from_pretrained.__func__

    def counted(cls, path, *args, **kwargs):
        loads.append(Path(path))
        return load(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", classmethod(counted))
    return loads


def test_llm_is_loaded_only_when_the_cache_lacks_a_label(tiny_llm, llm_loads, tmp_path):
    """A resumed round 0 whose prompts.json covers every label never loads the LLM; one whose cache lacks a label
    loads it once; the prompts (and the cache file) are the uninterrupted run's either way."""
    labels, cache = ["zebra", "yak"], tmp_path / "prompts.json"

    def expander():
        return LLMPromptExpander(tiny_llm, max_new_tokens=8, seed=0)

    first = expand_with_cache(expander(), labels, 3, cache)
    assert llm_loads == [Path(tiny_llm)]
    complete = cache.read_bytes()

    resumed = expander()  # built as synthesise_and_pretrain builds it: nothing loaded yet
    assert resumed.model is None
    assert expand_with_cache(resumed, labels, 3, cache) == first
    resumed.release()
    assert llm_loads == [Path(tiny_llm)] and resumed.model is None
    assert cache.read_bytes() == complete  # nothing rewritten

    data = json.loads(complete)
    del data["prompts"]["yak"]  # a cache written before "yak" was a label
    cache.write_text(json.dumps(data), encoding="utf-8")
    assert expand_with_cache(expander(), labels, 3, cache) == first
    assert llm_loads == [Path(tiny_llm)] * 2
    assert json.loads(cache.read_text()) == json.loads(complete)


def test_fedisyn_round_0_with_a_complete_cache_does_not_load_the_llm(tiny_llm, llm_loads, tmp_path):
    """FeDiSyn's round 0 (``synthesise_and_pretrain``) on a resumed run folder: its prompts.json covers every label,
    so the LLM named by ``llm_path`` is never loaded (stopped right after the prompts: no uploads)."""
    from fl_lightning.algorithms.synthetic_family.synthesis_step import synthesise_and_pretrain

    class Cfg:  # the keys read before the images
        llm_path, prompts_per_label = str(tiny_llm), 3

    labels = ["zebra", "yak"]
    cache = tmp_path / "prompts.json"  # as the first attempt's expansion left it (the expander's own description)
    cache.write_text(
        json.dumps(
            {
                "expander": LLMPromptExpander(tiny_llm, seed=0).description,
                "prompts": {label: [f"a {label}.", f"one {label}.", f"the {label}."] for label in labels},
            }
        ),
        encoding="utf-8",
    )
    written = cache.read_bytes()
    with pytest.raises(ValueError, match="latent uploads"):
        synthesise_and_pretrain(
            Cfg,
            components=None,
            uploads_by_client=None,
            class_counts={0: 5, 1: 5},
            class_names=labels,
            spec=None,
            run_dir=tmp_path,
            seed=0,
            device=torch.device("cpu"),
            precision="32-true",
            progress=False,
        )
    assert llm_loads == [] and cache.read_bytes() == written


class _Counting(TemplatePromptExpander):
    def __init__(self, seed=0):
        super().__init__(seed=seed)
        self.calls = []

    def expand(self, labels, per_label):
        self.calls.append(list(labels))
        return super().expand(labels, per_label)


def test_cache_expands_each_label_once(tmp_path):
    cache = tmp_path / "sub" / "prompts.json"
    exp = _Counting()
    first = expand_with_cache(exp, ["cat", "dog"], 3, cache)
    assert first == TemplatePromptExpander(seed=0).expand(["cat", "dog"], 3)
    assert expand_with_cache(exp, ["dog", "cat"], 2, cache) == {"dog": first["dog"][:2], "cat": first["cat"][:2]}
    assert exp.calls == [["cat", "dog"]]
    expand_with_cache(exp, ["cat", "owl"], 3, cache)  # only the new label is expanded
    assert exp.calls[-1] == ["owl"]
    expand_with_cache(exp, ["cat"], 5, cache)  # more prompts than cached → expand again
    assert exp.calls[-1] == ["cat"]
    data = json.loads(cache.read_text())
    assert data["expander"] == exp.description and set(data["prompts"]) == {"cat", "dog", "owl"}
    other = _Counting(seed=1)  # a different expander does not reuse another's prompts
    expand_with_cache(other, ["cat"], 3, cache)
    assert other.calls == [["cat"]]


def test_first_sentence_drops_leading_punctuation():
    assert _first_sentence(". zebra runs .") == "zebra runs ."
    assert _first_sentence('- "A zebra grazes." next') == "A zebra grazes."


def test_released_llm_is_collected_and_the_expander_says_so(tiny_llm):
    """release() drops the LLM: once collected (the pilots' release_accelerator_memory does gc.collect) its
    weights are gone; expanding afterwards is one clear error, not a silent reload."""
    import gc
    import weakref

    exp = LLMPromptExpander(tiny_llm, max_new_tokens=8, seed=0)
    exp.expand(["zebra"], 1)
    model = weakref.ref(exp.model)
    exp.release()
    gc.collect()
    assert model() is None
    with pytest.raises(RuntimeError, match="released"):
        exp.expand(["zebra"], 1)
    TemplatePromptExpander(seed=0).release()  # the template expander holds nothing: a no-op
