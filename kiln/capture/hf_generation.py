"""What `kiln.compile(model).generate(...)` changes of HuggingFace's generation loop, beside routing
its calls to the compiled forward (kiln/capture/api.py `ForwardRoute`): functions put in the
original model's instance dict for the method's duration, where HF's `GenerationMixin` looks them
up on `self`.

- `create_masks_for_generate` hands the 2D attention mask through. With a static (compileable) KV
  cache, `prepare_inputs_for_generation` builds each step's 4D mask before the forward — for
  forwards compiled without it — in eager Python: ~100-130 µs a token of llama-160m's int4 decode on
  2 cores of an AMD EPYC, just after the step's weights left the caches cold (a third of HF's own
  time between steps). The model's forward builds the same masks from the 2D one (as it does for a
  dynamic cache, and as HF's own function hands it through for layer types it does not know), here
  inside kiln's graph. Classes with masks of their own (token types, ALiBi: Gemma 3, PaliGemma,
  Bloom, ...) keep theirs, and so do models with sliding-window or chunked attention layers: their
  masks read the cache's position as a Python int (`cumulative_length_int`), which a graph would
  specialize on — a recompile per token up to the limit, then eager (Mistral with a window, Gemma 2).
- `_prepare_cache_for_generation` makes HF's cache, then, where it made a plain `DynamicCache`
  (no cache passed, no static `cache_implementation`), turns its layers into ones that append
  each token's keys and values in place (kiln/capture/hf_kv_cache.py): a `DynamicLayer` copies
  the whole cache each token (`torch.cat`), as eager does.
- `_valid_auto_compile_criteria` says no: on a GPU (or with `compile_config._compile_all_devices`)
  HF wraps a static-cache forward in `torch.compile` itself, which would trace Dynamo through kiln's
  compiled forward; kiln compiles the forward, so HF's compilation stays off for the call.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn


def masks_in_forward(*, attention_mask: Any = None, **_: Any) -> Any:
    """`create_masks_for_generate` while the compiled forward runs the steps: the mask as given."""
    return attention_mask


def no_auto_compile(*_: Any, **__: Any) -> bool:
    """`_valid_auto_compile_criteria` while kiln's compiled forward runs the steps: never."""
    return False


def growing_cache(module: nn.Module) -> Callable:
    """`_prepare_cache_for_generation` for `module`: HF's own, then a dynamic cache it made
    appended in place."""
    prepare = type(module)._prepare_cache_for_generation

    def prepare_growing(generation_config: Any, model_kwargs: dict, *args: Any, **kwargs: Any) -> Any:
        given = {name: model_kwargs.get(name) for name in _CACHE_KEYS}
        result = prepare(module, generation_config, model_kwargs, *args, **kwargs)
        made = [model_kwargs.get(name) for name in _CACHE_KEYS if model_kwargs.get(name) is not given[name]]
        if made and made[0] is not None:
            from kiln.capture.hf_kv_cache import grow_in_place  # transformers, only for its models

            grow_in_place(made[0], _capacity_hint(args, kwargs))
        return result

    return prepare_growing


# Where HF's generate keeps the cache it makes: "cache" (transformers 5), "past_key_values" (4.x).
_CACHE_KEYS = ("cache", "past_key_values")


def _capacity_hint(args: tuple, kwargs: dict) -> int:
    """`max_cache_length`, the last of `_prepare_cache_for_generation`'s arguments: generate's
    maximum length (0 where it is not an int)."""
    hint = kwargs.get("max_cache_length", args[-1] if args else 0)
    return hint if isinstance(hint, int) else 0


def generation_helpers(module: nn.Module) -> dict[str, Callable]:
    """The functions to put in `module`'s instance dict while a method of it runs through
    `kiln.compile(module)`: none for a module that is not a HuggingFace generation model."""
    cls = type(module)
    if not hasattr(cls, "prepare_inputs_for_generation"):
        return {}
    helpers: dict[str, Callable] = {}
    if not hasattr(cls, "create_masks_for_generate") and _full_attention_only(getattr(module, "config", None)):
        helpers["create_masks_for_generate"] = masks_in_forward
    if hasattr(cls, "_prepare_cache_for_generation"):
        helpers["_prepare_cache_for_generation"] = growing_cache(module)
    if hasattr(cls, "_valid_auto_compile_criteria"):
        helpers["_valid_auto_compile_criteria"] = no_auto_compile
    return helpers


def _full_attention_only(config: Any) -> bool:
    """Whether every layer of a HuggingFace config attends causally over the whole cache: no sliding
    window, no attention chunks, no layer types but full attention (what `create_masks_for_generate`
    tells apart)."""
    if config is None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "sliding_window", None) is not None or getattr(text, "attention_chunk_size", None) is not None:
        return False
    return all(kind == "full_attention" for kind in getattr(text, "layer_types", None) or ())
