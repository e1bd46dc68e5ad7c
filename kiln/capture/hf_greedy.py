"""kiln's decoding loop for `kiln.compile(model).generate(...)`: greedy search and sampling.

HuggingFace's `generate` prepares the call (configuration, logits processors, stopping criteria,
the cache, the prompt's mask) and then runs a decoding loop, `GenerationMixin._sample` for greedy
search and for sampling. Between two compiled decode steps that loop spends 0.7-0.9 ms of a
Qwen2-0.5B token on 2 cores of an AMD EPYC (an int4 token is ~9-11 ms):
`prepare_inputs_for_generation` ~0.16 ms and `_update_model_kwargs_for_generation` ~0.17 (Python
run just after the step's weights pushed it out of the caches), `torch.argmax` over the 151936
logits ~0.15 (ATen keeps an index beside every compared value), the stopping criteria ~0.04, a
float32 copy of the logits.

For a call of one of `_sample`'s modes the route (kiln/capture/api.py `ForwardRoute`) hands
`generate` this loop as its `custom_generate` (HF's public door for a decoding loop: `generate`
does all of its preparation, then calls it in `_sample`'s place). The loop gives `_sample`'s
tokens, draws what `_sample` draws from torch's generator, and leaves the cache as `_sample`
leaves it; per step it differs in these ways:

- plain greedy search (no logits processors) takes the next token by the extension's
  `greedy_tokens` (torch.argmax's answer, first index of the largest value or of the first NaN,
  in two vectorized passes: ~19 µs over 151936 logits), as the [batch, 1] column the loop appends,
  the logits not copied (float32 already; argmax is unchanged by the exact cast to float32), and
  the settled steps' next position ids are the extension's `successor` (each was an ATen call of
  20-40 µs with the caches cold after the step's weights); with processors, or sampling, the token is
  `_sample`'s own steps (`_token_choice`), but for minimum lengths alone, whose processors need
  not run where the greedy token is not an id they hold off;
- the stopping criteria are called only where they can stop: length limits and end-of-sequence
  tokens alone (`generate`'s own) are a comparison of lengths and of the new tokens as Python
  numbers, and rows are padded after their end only once one has ended;
- the new tokens are joined to the sequences (`torch.cat`) only when something reads them: HF's
  input function on the checked steps, a processor or stopping criterion that reads tokens, the
  result (a llama-160m int4 step's cat of the whole ids took 45-90 µs, the caches cold after its
  weights);
- each step's forward inputs and updated model kwargs are predicted from the step before, once
  the predictions equalled what HF's `prepare_inputs_for_generation` and
  `_update_model_kwargs_for_generation` returned for the first `CHECKED_STEPS` decode steps:
  the same keys, each value the same object, or an equal tensor of the same dtype, sizes and
  strides, or an equal constant. Where a prediction differs (token types, a mask HF rebuilds
  every step) or the class has functions of its own, HF's functions run on every step, as in
  `_sample`.

The route hands the loop over only where the call can only be greedy search or sampling of a
decoder-only model without what the loop does not do: no assistant, synced GPUs,
`custom_generate`, stop strings of the model's configuration, or positional arguments past the inputs; HF's `_sample`
and `generate` being `GenerationMixin`'s own; no `torch.distributed` process group; the mode of
the configuration `generate` will build (`_prepare_generation_config`) greedy search or sampling.
Inside, a call that asks for scores, logits, attentions or hidden states, or runs on a device
where HF defers the stop check (MPS), is handed back to `_sample` unchanged; one that asks for a
dict alone (`return_dict_in_generate`: the sequences and the cache, to go on from) gets `_sample`'s
`GenerateDecoderOnlyOutput` of them. A streamer is given what `_sample` gives
it: `generate` puts the prompt, the loop each step's tokens (a [batch] tensor on the CPU, after
the stopping criteria, as `_sample` puts them) and calls `end()` when the sequences are done.
Stop strings given to `generate` with their tokenizer are checked by HF's own criterion, which the
loop adds to the list (`generate` cannot make it: it drops the tokenizer before a callable
`custom_generate`).
`config.capture.greedy_loop` (`KILN_GREEDY_LOOP=0`) turns it off.

Once nothing but the loop's own code runs between the steps (plain greedy search, no streamer, the
criteria `generate`'s own, the inputs and kwargs predicted alone, no hooks on the model), the
steps are a settled run's (kiln/settled.py): each checks only the guards that read its new
arguments, and the frozen weights are stamped once (`config.capture.settled_steps`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch import nn

from kiln import config, settled
from kiln.capture.resume_at_break import has_hooks
from kiln.native import python_door

# Decode steps whose inputs and kwargs are HF's, each compared with its prediction, before the
# predictions are used alone: the first decode step has no previous step to predict from, the next
# two check the rule on a step whose lengths already grew.
CHECKED_STEPS = 3

# `generate` arguments that change what the decoding loop must do (or that `custom_generate`
# would drop from `_sample`'s arguments): with any of them HF runs its own loop.
_HF_LOOP_ARGUMENTS = ("custom_generate", "assistant_model", "assistant_tokenizer",
                      "synced_gpus", "prefix_allowed_tokens_fn", "negative_prompt_ids")


def decoding_loop_kwargs(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """`kwargs` for `module.generate(*args, **kwargs)`, with kiln's decoding loop as `custom_generate`
    where the call can only be greedy search or sampling returning tokens; `kwargs` itself otherwise."""
    if not config.capture.greedy_loop or len(args) > 1 or any(kwargs.get(name) is not None for name in _HF_LOOP_ARGUMENTS):
        return kwargs
    if not _hands_over_decoding(type(module)) or getattr(getattr(module, "config", None), "is_encoder_decoder", True):
        return kwargs
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return kwargs
    # (`generate` hands a callable `custom_generate` only `_sample`'s own arguments and the callable's
    # extra ones: not the streamer, which it gives the prompt itself, nor the tokenizer, without
    # which it cannot make stop strings' criterion: both are bound to the loop here, and stop
    # strings given as an argument are the loop's to check)
    given, bound = kwargs, {"streamer": kwargs.get("streamer")}
    if kwargs.get("stop_strings") is not None:
        if kwargs.get("tokenizer") is None:
            return kwargs  # (HF's own error names what is missing)
        bound.update(stop_strings=kwargs["stop_strings"], stop_tokenizer=kwargs["tokenizer"])
        kwargs = {name: value for name, value in kwargs.items() if name != "stop_strings"}
    if not _plain_search(module, kwargs):
        return given
    bound = {name: value for name, value in bound.items() if value is not None}
    loop = functools.partial(decoding_loop, **bound) if bound else decoding_loop
    return {**kwargs, "custom_generate": loop}


def _hands_over_decoding(cls: type) -> bool:
    """Whether `cls.generate` is HF's own, takes a callable `custom_generate`, and `_sample` is HF's
    (a class with its own loop keeps it)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:
        return False
    if getattr(cls, "_sample", None) is not GenerationMixin._sample or getattr(cls, "generate", None) is not GenerationMixin.generate:
        return False
    if not all(hasattr(cls, name) for name in ("_prefill", "_prepare_generation_config", "_optimize_model_for_decode")):
        return False
    parameter = inspect.signature(GenerationMixin.generate).parameters.get("custom_generate")
    return parameter is not None and "Callable" in str(parameter.annotation)


def _plain_search(module: nn.Module, kwargs: dict) -> bool:
    """Whether the configuration `generate` will build from `kwargs` asks for greedy search or
    sampling (one sequence searched: `_sample`'s modes) and returns the tokens, or them and the
    cache, nothing else (`_asks_for_outputs`); HF's own merge of the model's configuration, the
    defaults and the arguments."""
    from transformers.generation.configuration_utils import GenerationMode

    options = {name: value for name, value in kwargs.items()
               if name not in ("generation_config", "inputs", "streamer", "tokenizer")}
    try:
        generation_config, _ = module._prepare_generation_config(kwargs.get("generation_config"), **options)
        # (stop strings of the model's configuration need the tokenizer `generate` drops: HF's loop)
        return (generation_config.get_generation_mode(None) in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE)
                and not _asks_for_outputs(generation_config) and generation_config.stop_strings is None)
    except Exception:  # noqa: BLE001 - whatever HF objects to, it reports itself in its own generate
        return False


def _asks_for_outputs(generation_config: Any) -> bool:
    """Whether a call returns more than its sequences and its cache: a dict with scores, logits,
    attentions or hidden states (`_sample` gathers them every step; kiln's loop does not)."""
    return bool(generation_config.return_dict_in_generate and any(
        getattr(generation_config, name, False)
        for name in ("output_scores", "output_logits", "output_attentions", "output_hidden_states")))


def decoding_loop(model: nn.Module, input_ids: torch.LongTensor, logits_processor: Any, stopping_criteria: Any,
                    generation_config: Any, synced_gpus: bool = False, streamer: Any = None, *,
                    stop_strings: Any = None, stop_tokenizer: Any = None, **model_kwargs: Any) -> Any:
    """HF's `_sample` for greedy search or sampling without outputs beside the tokens and the cache
    (the signature is `_sample`'s, so that `generate` hands it the same arguments). `stop_strings`
    with their `stop_tokenizer`: the criterion `generate` would have made for them (bound by the route)."""
    if stop_strings is not None:
        from transformers.generation.stopping_criteria import StoppingCriteriaList, StopStringCriteria

        stopping_criteria = StoppingCriteriaList(
            [*stopping_criteria, StopStringCriteria(stop_strings=stop_strings, tokenizer=stop_tokenizer)])
    if (synced_gpus or _asks_for_outputs(generation_config)
            or input_ids.device.type == "mps" or getattr(generation_config, "is_assistant", False)):
        return type(model)._sample(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                   synced_gpus, streamer, **model_kwargs)
    choose = _token_choice(logits_processor, generation_config.do_sample)
    pad_token = getattr(generation_config, "_pad_token_tensor", None)
    if pad_token is not None:
        pad_token = pad_token.to(input_ids.device)
    marks_finished = any(hasattr(criterion, "eos_token_id") for criterion in stopping_criteria)
    stop = _stop_function(stopping_criteria)
    tokens = Tokens(input_ids)
    unfinished = torch.ones(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    all_unfinished = True  # (then `_sample`'s padding of finished rows changes no token: skipped)
    steps = StepInputs(model)
    # Steps between which only this loop's own code runs may be a settled run's (kiln/settled.py).
    only_kiln = (config.capture.settled_steps and not generation_config.do_sample and not len(logits_processor)
                 and streamer is None and _generates_own_criteria(stopping_criteria))
    run: settled.Run | None = None
    outputs = model._prefill(input_ids, generation_config, model_kwargs, is_first_iteration=True)
    with model._optimize_model_for_decode():
        while True:
            model_kwargs = steps.updated(outputs, model_kwargs)
            column = choose(outputs.logits, tokens)
            del outputs
            if marks_finished and not all_unfinished:
                column = column * unfinished[:, None] + pad_token * (1 - unfinished[:, None])
            tokens.append(column)
            done = stop(tokens, column)
            if streamer is not None:  # (`_sample`'s put: the step's tokens, [batch], on the CPU; a copy, as
                streamer.put(column[:, 0].to("cpu", copy=True))  # a streamer may keep what it is given)
            if done is not None:
                unfinished, all_unfinished = unfinished & ~done, False
                if unfinished.max() == 0:
                    if streamer is not None:
                        streamer.end()
                    return _result(tokens.whole(), generation_config, model_kwargs)
            if not (only_kiln and steps.predicted_alone):
                run = None
            elif run is None and not has_hooks(model):
                run = settled.Run()
            inputs = steps.inputs(tokens, column, model_kwargs)
            outputs = (settled.call(run, model, **inputs, return_dict=True) if run is not None
                       else model(**inputs, return_dict=True))


def _result(sequences: torch.Tensor, generation_config: Any, model_kwargs: dict) -> Any:
    """What `_sample` returns without scores, logits, attentions or hidden states: the sequences,
    or with `return_dict_in_generate` HF's output of them and the cache (the model kwargs' first
    cache entry, as `_sample` finds it)."""
    if not generation_config.return_dict_in_generate:
        return sequences
    from transformers.generation.utils import ALL_CACHE_NAMES, GenerateDecoderOnlyOutput

    cache = next((model_kwargs[name] for name in ALL_CACHE_NAMES if name in model_kwargs), None)
    return GenerateDecoderOnlyOutput(sequences=sequences, cache=cache)


class Tokens:
    """The sequences so far: the prompt and every new column, joined (`whole()`) only when read."""

    def __init__(self, input_ids: torch.Tensor) -> None:
        self._ids, self._columns = input_ids, []
        self.length, self.device = input_ids.shape[1], input_ids.device

    def append(self, column: torch.Tensor) -> None:
        self._columns.append(column)
        self.length += 1

    def whole(self) -> torch.Tensor:
        if self._columns:
            self._ids = torch.cat([self._ids, *self._columns], dim=-1)
            self._columns = []
        return self._ids


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """`torch.argmax(logits[:, -1], -1)` of a (batch, positions, vocabulary) tensor: the
    extension's two vectorized passes where it takes `logits`."""
    return _tokens(logits, python_door.greedy_tokens_function())


def _tokens(logits: torch.Tensor, fast: Callable[..., torch.Tensor | None] | None) -> torch.Tensor:
    tokens = fast(logits) if fast is not None else None
    return tokens if tokens is not None else torch.argmax(logits[:, -1], dim=-1)


def _column(logits: torch.Tensor, fast: Callable[..., torch.Tensor | None] | None) -> torch.Tensor:
    """`_tokens` as a [batch, 1] column, made so by the extension where it takes `logits` (a view
    through the dispatcher was ~37 us of a Qwen2-0.5B int4 token, its caches cold after the weights)."""
    column = fast(logits, True) if fast is not None else None
    return column if column is not None else torch.argmax(logits[:, -1], dim=-1, keepdim=True)


def _token_choice(logits_processor: Any, sample: bool) -> Callable[[torch.Tensor, Tokens], torch.Tensor]:
    """`choose(logits, tokens)`: the step's next tokens, a [batch, 1] column. Plain greedy search: `greedy_tokens`, no
    copy. With logits processors or sampling, `_sample`'s own steps on the same values in the same
    order (a float32 copy of the last position's logits, the processors over the whole ids, then
    argmax or a draw from the softmax by `torch.multinomial`): the same tokens, and the same draws
    from torch's generator, as HF's loop. Greedy search whose processors are minimum lengths alone
    takes `greedy_tokens` too where no row's token is an id the minimum holds off (`_held_ids`)."""
    fast = python_door.greedy_tokens_function()  # (resolved once: the step's Python runs cold)

    def greedy(logits: torch.Tensor, tokens: Tokens) -> torch.Tensor:
        column = _column(logits, fast)
        return column if column.device == tokens.device else column.to(tokens.device)

    def hf_steps(logits: torch.Tensor, tokens: Tokens) -> torch.Tensor:
        last = logits[:, -1].to(copy=True, dtype=torch.float32, device=tokens.device)
        scores = logits_processor(tokens.whole(), last)
        if sample:
            return torch.multinomial(torch.nn.functional.softmax(scores, dim=-1), num_samples=1)
        return torch.argmax(scores, dim=-1, keepdim=True)

    if sample:
        return hf_steps
    if not len(logits_processor):
        return greedy
    held_ids = _held_ids(logits_processor)
    if held_ids is None:
        return hf_steps

    def choose(logits: torch.Tensor, tokens: Tokens) -> torch.Tensor:
        held = held_ids(tokens.length)
        chosen = greedy(logits, tokens)
        if held and any(token in held for token in chosen.reshape(-1).tolist()):
            return hf_steps(logits, tokens)
        return chosen

    return choose


def _held_ids(logits_processor: Any) -> Callable[[int], set[int]] | None:
    """For processors that are all HF's minimum lengths (`MinLengthLogitsProcessor`,
    `MinNewTokensLengthLogitsProcessor`: their end-of-sequence ids at -inf while the ids are
    shorter than a length), `held(length)`: the ids held off at that length; None for any other.
    Masking ids that are not the argmax leaves it where it is (the first largest value, or the
    first NaN, lies elsewhere), so where no row's greedy token is held, the tokens are the
    processors' without calling them (each makes an `arange` of the vocabulary and `torch.isin`
    of it every step, also after the minimum, ~0.2 ms a llama-160m int4 token)."""
    from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    below: list[tuple[int, set[int]]] = []
    for processor in logits_processor:
        if type(processor) is MinLengthLogitsProcessor:
            length = processor.min_length
        elif type(processor) is MinNewTokensLengthLogitsProcessor:
            length = processor.prompt_length_to_skip + processor.min_new_tokens
        else:
            return None
        below.append((int(length), _token_ids(processor.eos_token_id)))
    return lambda length: {i for limit, ids in below if length < limit for i in ids}


def _token_ids(ids: Any) -> set[int]:
    """The end-of-sequence ids an HF processor or criterion holds (a tensor, an int or a list), as numbers."""
    if isinstance(ids, torch.Tensor):
        return {int(i) for i in ids.reshape(-1).tolist()}
    return {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}


def _generates_own_criteria(stopping_criteria: Any) -> bool:
    """Whether the criteria are length limits and end-of-sequence tokens alone (`generate`'s own)."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    return all(type(criterion) in (MaxLengthCriteria, EosTokenCriteria) for criterion in stopping_criteria)


def _stop_function(stopping_criteria: Any) -> Callable[[Tokens, torch.Tensor], torch.Tensor | None]:
    """`stop(tokens, column)`: the criteria's verdict per sequence, or None where none is done.
    Length limits and end-of-sequence tokens alone (what `generate` itself makes:
    `MaxLengthCriteria`, `EosTokenCriteria`) are a comparison of lengths and of the new column's
    tokens, as Python numbers: HF's list reads the whole ids (a `torch.cat` a step) and calls
    `torch.isin`, ~0.2 ms a llama-160m int4 token on 2 cores, its caches cold after the step's
    weights. HF's length criterion also warns past the model's positions: it is called there;
    other criteria are called on every step."""
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    if not _generates_own_criteria(stopping_criteria):
        return lambda tokens, column: stopping_criteria(tokens.whole(), None)
    lengths = [criterion for criterion in stopping_criteria if type(criterion) is MaxLengthCriteria]
    limit = min((criterion.max_length for criterion in lengths), default=None)
    positions = [criterion.max_position_embeddings for criterion in lengths
                 if criterion.max_position_embeddings is not None]
    beyond = min(positions, default=None)
    ends = set().union(*(_token_ids(criterion.eos_token_id) for criterion in stopping_criteria
                         if type(criterion) is EosTokenCriteria))

    def stop(tokens: Tokens, column: torch.Tensor) -> torch.Tensor | None:
        length = tokens.length
        if beyond is not None and length > beyond:
            return stopping_criteria(tokens.whole(), None)
        if limit is not None and length >= limit:
            return torch.ones(column.shape[0], dtype=torch.bool, device=column.device)
        if not ends:
            return None
        ended = [token in ends for token in column.reshape(-1).tolist()]
        return torch.tensor(ended, dtype=torch.bool, device=column.device) if any(ended) else None

    return stop


class StepInputs:
    """A decode step's forward inputs (`inputs`) and the model kwargs after a forward (`updated`):
    HF's functions, compared with the predictions from the step before for the first
    `CHECKED_STEPS` steps, then the predictions alone where every one matched."""

    def __init__(self, model: nn.Module) -> None:
        from transformers.generation.utils import GenerationMixin

        self.model = model
        self.checked_inputs = 0  # decode steps whose inputs HF made (the first has no prediction)
        self.checked_updates = 0
        # Until a prediction differs; never for a class with functions of its own (whose results
        # may change their rule on a later step than those compared).
        cls = type(model)
        self.trusted_inputs = cls.prepare_inputs_for_generation is GenerationMixin.prepare_inputs_for_generation
        self.trusted_updates = cls._update_model_kwargs_for_generation is GenerationMixin._update_model_kwargs_for_generation
        self.last_inputs: dict | None = None  # HF's (or the predicted) inputs of the step before
        self.last_kwargs: dict | None = None  # the model kwargs they were made from
        self.successor: Callable[[torch.Tensor], torch.Tensor | None] | None = None  # (the extension's, once loaded)

    @property
    def settled(self) -> bool:
        """Whether the inputs are predicted alone from now on."""
        return self.trusted_inputs and self.checked_inputs >= CHECKED_STEPS

    @property
    def predicted_alone(self) -> bool:
        """Whether the inputs and the updated kwargs are predicted alone from now on (none of HF's
        functions runs between the steps)."""
        return self.settled and self.trusted_updates and self.checked_updates >= CHECKED_STEPS

    def inputs(self, tokens: Tokens, column: torch.Tensor, model_kwargs: dict) -> dict:
        """The forward's inputs for the step after `tokens`, whose last `column` is the new tokens."""
        predicted = (_predicted_inputs(self.last_inputs, self.last_kwargs, model_kwargs, column, self._next_positions)
                     if self.last_inputs is not None and self.trusted_inputs else None)
        if predicted is None or not self.settled:
            made = self.model.prepare_inputs_for_generation(
                tokens.whole(), next_sequence_length=1 if model_kwargs.get("use_cache") else None, **model_kwargs)
            if self.checked_inputs > 0 and not _same_values(made, predicted):
                self.trusted_inputs = False
            self.checked_inputs += 1
            predicted = made
        self.last_inputs, self.last_kwargs = predicted, dict(model_kwargs)
        return predicted

    def _next_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """positions + 1, by the extension where it takes them (loaded by the first compiled
        graph: ~38 us through the dispatcher with a Qwen2-0.5B int4 token's caches cold)."""
        if self.successor is None:
            self.successor = python_door.successor_function()
        made = self.successor(positions) if self.successor is not None else None
        return made if made is not None else positions + 1

    def updated(self, outputs: Any, model_kwargs: dict) -> dict:
        # Once the inputs are predicted alone (their keys and kinds fixed: a prediction from predicted
        # inputs cannot fail), position ids come from the last step's and a mask the inputs do not
        # hold is read by nobody: neither kwarg is grown (a static cache's inputs hold no mask; its
        # cat of a column of ones was two ATen calls a step).
        settled = self.settled
        grow_mask = not settled or "attention_mask" in (self.last_inputs or {})
        predicted = _predicted_update(outputs, model_kwargs, not settled, grow_mask) if self.trusted_updates else None
        if predicted is None or self.checked_updates < CHECKED_STEPS:
            made = self.model._update_model_kwargs_for_generation(outputs, dict(model_kwargs), is_encoder_decoder=False)
            if not _same_values(made, predicted):
                self.trusted_updates = False
            self.checked_updates += 1
            return made
        return predicted


def _predicted_inputs(last: dict, last_kwargs: dict, model_kwargs: dict, column: torch.Tensor,
                      next_positions: Callable[[torch.Tensor], torch.Tensor] = lambda positions: positions + 1) -> dict | None:
    """This step's inputs from the last step's: the new tokens as `input_ids` (a column), each value
    that was a model kwarg that kwarg's value now, the position ids one more (HF slices the last
    column of the kwarg it grows by one), constants as they were; None where another value is seen."""
    predicted = {}
    for name, value in last.items():
        if name == "input_ids":
            predicted[name] = column
        elif name in last_kwargs and last_kwargs[name] is value and name in model_kwargs:
            predicted[name] = model_kwargs[name]
        elif name == "position_ids" and _last_column_of(value, last_kwargs.get(name)):
            predicted[name] = next_positions(value)
        elif value is None or type(value) in (bool, int, float, str):
            predicted[name] = value
        else:
            return None
    return predicted


def _last_column_of(value: Any, kwarg: Any) -> bool:
    """Whether `value` may be the last column of the model kwarg `kwarg` (both tensors, `kwarg` longer)."""
    return (isinstance(value, torch.Tensor) and isinstance(kwarg, torch.Tensor) and value.dim() == kwarg.dim() > 0
            and value.shape[-1] == 1 < kwarg.shape[-1])


def _predicted_update(outputs: Any, model_kwargs: dict, grow_positions: bool = True, grow_mask: bool = True) -> dict | None:
    """The model kwargs after a step, as HF's generic update makes them where no token types
    move: the cache the forward returned, the position ids one column longer (the last plus one;
    not with `grow_positions` False), the 2D mask one column of ones longer (not with `grow_mask` False)."""
    if any(model_kwargs.get(name) is not None for name in ("token_type_ids", "mm_token_type_ids")):
        return None
    updated = dict(model_kwargs)
    if "cache" in outputs:
        updated["cache"] = outputs["cache"]
    positions = updated.get("position_ids")
    if positions is not None and grow_positions:
        updated["position_ids"] = torch.cat([positions, positions[..., -1:] + 1], dim=-1)
    mask = updated.get("attention_mask")
    if mask is not None and grow_mask:
        updated["attention_mask"] = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
    return updated


def _same_values(made: dict, predicted: dict | None) -> bool:
    """Whether `predicted` has `made`'s keys in its order, each value the same object, an equal
    tensor of the same dtype, device, sizes and strides, or an equal value of the same type."""
    if predicted is None or list(made) != list(predicted):
        return False
    for name, value in made.items():
        other = predicted[name]
        if value is other:
            continue
        if isinstance(value, torch.Tensor) and type(other) is type(value):
            if (value.dtype, value.device, value.shape, value.stride()) != (other.dtype, other.device, other.shape, other.stride()):
                return False
            if not torch.equal(value, other):
                return False
        elif type(value) is not type(other) or isinstance(value, torch.Tensor) or value != other:
            return False
    return True
