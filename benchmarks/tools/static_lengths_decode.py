"""Decode speed of a static cache whose step graph is symbolic in the cache length: `generate`
with three lengths first (17, 33, 65 new tokens after a 128-token prompt), then 4 timed rounds of 97;
the median step forward and the decode time a token per round, and which attention each graph runs.

    python benchmarks/tools/static_lengths_decode.py qwen2-0.5b int8    # or fp32, int4
"""
import os
import statistics
import sys
import time

import torch
sys.path.insert(0, os.getcwd())
import kiln

from benchmarks.llm_modes import LLM_MODELS
from benchmarks.llm import generate_options
torch.set_num_threads(2)
model = LLM_MODELS[sys.argv[1]].build()
if sys.argv[2] != "fp32": model = kiln.quantize(model, sys.argv[2])
prompt = torch.randint(0, 1000, (1, 128)); am = torch.ones_like(prompt)
cm = kiln.compile(model)
fwd = []
model.register_forward_pre_hook(lambda m, a: fwd.append(time.perf_counter()))
model.register_forward_hook(lambda m, a, o: fwd.append(time.perf_counter()))
with torch.no_grad():
    for n in (17, 33, 65):  # three lengths: the step's graph symbolic in the cache length
        cm.generate(prompt, attention_mask=am, **generate_options(n))
    res = []
    for r in range(4):
        fwd.clear(); t = time.perf_counter()
        cm.generate(prompt, attention_mask=am, **generate_options(97))
        dt = time.perf_counter() - t
        steps = [fwd[i + 1] - fwd[i] for i in range(2, len(fwd), 2)]
        res.append((statistics.median(steps) * 1000, (dt - (fwd[1] - fwd[0])) * 1000 / 96))
print(sys.argv[1:3], "forward median", " ".join(f"{a:.2f}" for a, b in res), " ms/token", " ".join(f"{b:.2f}" for a, b in res))
from kiln.runtime import compiled_graph
import re
for g in compiled_graph.LIVE:
    print("graph", sorted(set(re.findall(r"(kiln::attention|aten::_scaled_dot_product_flash_attention_for_cpu)", " ".join(g.artifact.ops.values())))), "numbers", g.artifact.number_inputs[:3])
