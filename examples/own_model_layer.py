"""One attention layer of your own Hugging Face model: its certified local Lipschitz constant.

The model object itself is passed to meanfield (BERT, GPT-2 and Llama-style models). So that the
script runs offline in a few seconds, the model here is a tiny random GPT-2 built from
transformers' own config class; with your checkpoint, load it as usual instead, e.g.
``model = transformers.AutoModel.from_pretrained("path/to/checkpoint")``.

Run: ``python examples/own_model_layer.py`` (needs the ``hf`` extra: ``pip install ".[hf]"``).
"""

import torch
import transformers

from meanfield import local_lipschitz
from meanfield.models import hidden_states, is_causal, params_from_hf, tiny_config

torch.manual_seed(0)
config = tiny_config("gpt2", d=64, heads=4, layers=2, vocab=100, positions=64,
                     bos_token_id=0, eos_token_id=0)  # fmt: skip
model = transformers.GPT2Model(config).eval()
layer, n = 1, 32

# The layer's weights in the toolkit's convention: per head A_h = Q_h^T K_h / sqrt(k) and V_h,
# then the output projection W_O (float64 copies; the model is not modified).
params = params_from_hf(model, layer, dtype=torch.float64)
causal = is_causal(model)  # GPT-2 masks: token i attends to tokens j <= i
print(f"layer {layer}: {params.n_heads} heads, d = {params.d}, causal = {causal}")

# The hidden states entering that layer's attention (after ln_1) for one window of n token ids.
ids = torch.randint(1, 100, (n,))
X = hidden_states(model, None, ids, layer, n, n_windows=1).X[0]  # shape (n, d), float64

# ||Df(X)||_2 with a bracket that holds in floating point (rounding included), and a tighter
# upper end that holds with probability >= confidence over the solver's random start.
est = local_lipschitz(X, params, masked=causal)
print(f"method {est.method}, {int(est.n_matvec)} Jacobian products")
print(f"estimate    ||Df(X)||_2 = {float(est.value):.8g}")
print(f"certified   lower = {float(est.lower):.8g}, upper = {float(est.upper):.8g}")
print(f"upper_prob  {float(est.upper_prob):.8g} (confidence {est.confidence})")
