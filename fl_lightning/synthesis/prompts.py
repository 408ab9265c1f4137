"""FeDiSyn step 1, server side: expand each class label into several text prompts.

The paper asks a large language model (LLaMA-7B), per label, the question :data:`QUESTION` and uses
the answers as Stable Diffusion prompts, so that images of one class vary in look and action.

* :class:`LLMPromptExpander` — any causal LM that transformers can load from a local folder
  (``AutoTokenizer`` + ``AutoModelForCausalLM``, ``local_files_only``), sampled with a seed. Each
  answer is cut to its first sentence; answers that do not mention the label are replaced by a
  template sentence, so every label always gets the number of prompts asked for.
* :class:`TemplatePromptExpander` — the offline fallback: templates × attributes × scenes,
  drawn without replacement by a generator seeded from (seed, label). Deterministic and varied.
* :func:`expand_with_cache` — keeps the prompts in a JSON file, so the LLM runs once per label.

Both expanders have ``expand(labels, per_label) -> {label: [prompt, ...]}`` and a ``description``
string (stored in the cache to notice when the expander changed).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fl_lightning.durable_write import write_text_atomic
from fl_lightning.errors import MissingResourceError

__all__ = [
    "QUESTION",
    "PromptExpander",
    "TemplatePromptExpander",
    "LLMPromptExpander",
    "expand_with_cache",
]

#: The paper's question to the LLM, per label.
QUESTION = 'Write a sentence using the word "{label}" to describe the characteristics and actions of the object.'

# The template space: 8 × 12 × 10 = 960 distinct prompts per label before any repeats.
_TEMPLATES: tuple[str, ...] = (
    "a photo of the {attr} {label} {scene}.",
    "a close-up photo of the {attr} {label} {scene}.",
    "the {attr} {label} {scene}, in sharp focus.",
    "a picture showing one {attr} {label} {scene}.",
    "a realistic image of the {label}, {attr}, {scene}.",
    "one {label} that looks {attr}, {scene}.",
    "a cropped photo of the {attr} {label} {scene}.",
    "a good photo of the {attr} {label} {scene}, natural colors.",
)
_ATTRIBUTES: tuple[str, ...] = (
    "small",
    "large",
    "bright",
    "dark",
    "colorful",
    "old",
    "clean",
    "detailed",
    "shiny",
    "weathered",
    "typical",
    "striking",
)
_SCENES: tuple[str, ...] = (
    "in the wild",
    "on a table",
    "in a city street",
    "at sunset",
    "seen from above",
    "in soft daylight",
    "indoors",
    "against a plain background",
    "in motion",
    "up close",
)


def _readable(label: str) -> str:
    """Class names such as ``apple_pie`` read as ``apple pie`` in a sentence."""
    return " ".join(label.replace("_", " ").split())


def _label_seed(seed: int, label: str) -> list[int]:
    # crc32, not hash(): Python's str hash changes between processes.
    return [int(seed), zlib.crc32(label.encode("utf-8"))]


def _check_per_label(per_label: int) -> None:
    if int(per_label) < 1:
        raise ValueError(f"per_label (prompts per label) must be an int >= 1, got {per_label!r}")


class PromptExpander(Protocol):
    """Anything that turns labels into prompts."""

    description: str

    def expand(self, labels: Sequence[str], per_label: int) -> dict[str, list[str]]: ...

    def release(self) -> None:
        """Drop what the expander holds on the accelerator (it is not used again)."""


class TemplatePromptExpander:
    """Deterministic, varied prompts without a language model (templates × attributes × scenes).

    Args:
        seed: the prompts of a label depend only on (seed, label).

    Example:
        >>> TemplatePromptExpander(seed=0).expand(["cat"], 2)["cat"]  # doctest: +SKIP
        ['a cropped photo of the shiny cat at sunset.', 'the old cat indoors, in sharp focus.']
    """

    def __init__(self, *, seed: int = 0) -> None:
        self.seed = int(seed)
        self.description = f"template(seed={self.seed})"

    def prompts_for(self, label: str, per_label: int) -> list[str]:
        """``per_label`` prompts for one label: distinct while the template space lasts, then cycled."""
        _check_per_label(per_label)
        name = _readable(label)
        n_t, n_a, n_s = len(_TEMPLATES), len(_ATTRIBUTES), len(_SCENES)
        order = np.random.default_rng(_label_seed(self.seed, label)).permutation(n_t * n_a * n_s)
        out = []
        for j in range(int(per_label)):
            code = int(order[j % order.size])
            t, rest = divmod(code, n_a * n_s)
            a, s = divmod(rest, n_s)
            out.append(_TEMPLATES[t].format(label=name, attr=_ATTRIBUTES[a], scene=_SCENES[s]))
        return out

    def expand(self, labels: Sequence[str], per_label: int) -> dict[str, list[str]]:
        """``{label: per_label prompts}``, each containing the (readable) label."""
        return {label: self.prompts_for(label, per_label) for label in labels}

    def release(self) -> None:
        """Nothing to drop: the templates hold no model."""


# A sentence ends at . ! or ? followed (after an optional closing quote) by a space or the end.
_SENTENCE = re.compile(r"(.+?[.!?])(?=[\"'”]?(?:\s|$))", re.DOTALL)


def _first_sentence(text: str) -> str:
    """The first sentence of a generated answer, whitespace collapsed, quotes stripped."""
    # Drop what a model may put before the sentence: quotes, stray punctuation, list dashes.
    text = " ".join(text.split()).lstrip(" \"'“”.,;:!?-*")
    match = _SENTENCE.match(text)
    return (match.group(1) if match else text).strip(" \"'“”")


def _mentions(sentence: str, label: str) -> bool:
    return re.search(rf"\b{re.escape(_readable(label))}\b", sentence, flags=re.IGNORECASE) is not None


_LLM_HINT = (
    "set fedisyn.llm_path to a local transformers causal-LM folder (e.g. LLaMA-7B saved with "
    "save_pretrained) or a hub id in the Hugging Face cache, or set it to null to use the template prompt expander"
)


class LLMPromptExpander:
    """Prompts written by a local causal language model (the paper uses LLaMA-7B).

    The model is loaded when the first label is expanded, so :func:`expand_with_cache` with a cache that
    already covers every label never loads it.

    Args:
        model_path: folder with a transformers tokenizer and causal-LM weights.
        max_new_tokens: length limit of each answer.
        device: where the model runs.
        dtype: model dtype (``torch.float16``/``bfloat16`` on a GPU).
        seed: sampling seed; the prompts of a label depend only on (seed, label).
        temperature: sampling temperature.
        top_p: nucleus-sampling mass.

    Raises:
        MissingResourceError: ``model_path`` is not a folder (here), or holds no loadable model (at the first
            expansion).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        max_new_tokens: int = 48,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        temperature: float = 0.9,
        top_p: float = 0.95,
    ) -> None:
        self.model_path = Path(model_path).expanduser()
        if not self.model_path.exists():  # a hub id: its snapshot in the HF cache (models/hub.py; never fetched here)
            from fl_lightning.models.hub import looks_like_hub_id, resolve_local_or_hub

            if looks_like_hub_id(str(model_path)):
                self.model_path = resolve_local_or_hub(
                    str(model_path), download=False, key="llm_path", download_key="model.download", what="a causal-LM folder"
                )
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
        if not temperature > 0:
            raise ValueError(f"temperature must be a float > 0, got {temperature!r}")
        if not self.model_path.is_dir():
            raise MissingResourceError(f"language model not found: {self.model_path} is not a folder; {_LLM_HINT}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_new_tokens = int(max_new_tokens)
        self.seed = int(seed)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.fallback = TemplatePromptExpander(seed=seed)
        self.description = (
            f"llm(path={self.model_path}, seed={self.seed}, temperature={self.temperature}, "
            f"top_p={self.top_p}, max_new_tokens={self.max_new_tokens})"
        )
        # Loaded on the first expansion (_load), not here: a cache that already holds every label (a resumed
        # round 0) never needs the model, and a 7B LLM costs minutes and its size in memory to load.
        self.tokenizer: Any = None
        self.model: Any = None
        self._released = False

    def _load(self) -> None:
        """Load the tokenizer and the model from ``model_path`` (once; never after :meth:`release`)."""
        if self._released:
            raise RuntimeError(f"{self.description}: the language model was released; build a new expander")
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(self.model_path, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(self.model_path, local_files_only=True, dtype=self.dtype)
        except (OSError, ValueError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise MissingResourceError(f"could not load a language model from {self.model_path} ({first}); {_LLM_HINT}") from err
        self.tokenizer = tokenizer
        self.model = model.to(self.device).eval().requires_grad_(False)

    def _query(self, label: str) -> str:
        question = QUESTION.format(label=_readable(label))
        if getattr(self.tokenizer, "chat_template", None):  # instruction-tuned models want their chat format
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
        return question + "\n"

    def release(self) -> None:
        """Drop the language model (if it was loaded): its weights' memory is free once collected
        (``gc.collect``; on CUDA the caching allocator then still reserves it until ``torch.cuda.empty_cache``).
        The expander cannot expand afterwards; the cache file it filled stays valid."""
        self.model = self.tokenizer = None
        self._released = True

    @torch.no_grad()
    def _answers(self, label: str, n: int) -> list[str]:
        self._load()
        inputs = self.tokenizer(self._query(label), return_tensors="pt").to(self.device)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        # generate() samples from the global RNG: fork it so the caller's RNG state is untouched.
        with torch.random.fork_rng(devices=devices):
            seed = int(np.random.default_rng(_label_seed(self.seed, label)).integers(0, 2**63 - 1))
            torch.manual_seed(seed)
            out = self.model.generate(
                **inputs,
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                max_new_tokens=self.max_new_tokens,
                num_return_sequences=n,
                pad_token_id=pad_id,
            )
        new_tokens = out[:, inputs["input_ids"].shape[1] :]
        return self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)

    def prompts_for(self, label: str, per_label: int) -> list[str]:
        """``per_label`` one-sentence prompts mentioning the label (template sentences fill the gaps)."""
        _check_per_label(per_label)
        kept: list[str] = []
        for answer in self._answers(label, int(per_label)):
            sentence = _first_sentence(answer)
            if sentence and _mentions(sentence, label) and sentence not in kept:
                kept.append(sentence)
        templates = [p for p in self.fallback.prompts_for(label, int(per_label) + len(kept)) if p not in kept]
        return kept + templates[: int(per_label) - len(kept)]

    def expand(self, labels: Sequence[str], per_label: int) -> dict[str, list[str]]:
        """``{label: per_label prompts}``, each containing the (readable) label."""
        return {label: self.prompts_for(label, per_label) for label in labels}


def expand_with_cache(
    expander: PromptExpander, labels: Sequence[str], per_label: int, cache_path: str | Path
) -> dict[str, list[str]]:
    """Expand ``labels``, reading and writing a JSON cache so each label is expanded once.

    The cache file is ``{"expander": description, "prompts": {label: [...]}}``. Entries made by a
    different expander (other model, other seed) are discarded; a label with fewer cached prompts
    than ``per_label`` is expanded again.

    Args:
        expander: a :class:`TemplatePromptExpander` or :class:`LLMPromptExpander`.
        labels: class names.
        per_label: prompts per label.
        cache_path: JSON file (created with its folder).

    Returns:
        ``{label: per_label prompts}`` for the requested labels.
    """
    _check_per_label(per_label)
    cache_path = Path(cache_path)
    cached: dict[str, list[str]] = {}
    if cache_path.is_file():
        data = json.loads(cache_path.read_text(encoding="utf-8"))
        if data.get("expander") == expander.description:
            cached = {str(k): list(v) for k, v in data.get("prompts", {}).items()}
    missing = [label for label in labels if len(cached.get(label, [])) < per_label]
    if missing:
        cached.update(expander.expand(missing, per_label))
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(  # a crash never leaves half a cache
            cache_path, json.dumps({"expander": expander.description, "prompts": cached}, indent=1, ensure_ascii=False)
        )
    return {label: cached[label][:per_label] for label in labels}
