"""Writes weights whose loss is finite but whose gradient norm is not (kiln-run-files.test).
Usage: overflow_grad_init.py IN OUT

ln_f's weight is zeroed and its bias set to 2e38, so every position's final hidden state is 2e38
in every channel; wte is zeroed but for wte[0][0] = 5e-38 (a normal float), so token 0's logit is
10 and every other one 0: the loss is about 10. Token 0's probability, about 0.98 at every position,
makes the gradient of wte's row 0 about 2e38 in each of its 64 channels: every element a finite
float, but the norm (about 1.6e39) beyond float's largest (3.4e38)."""
import sys

from safetensors_edit import Weights

src, out = sys.argv[1], sys.argv[2]
w = Weights(src)
w.fill("transformer.ln_f.weight", [0.0] * w.count("transformer.ln_f.weight"))
w.fill("transformer.ln_f.bias", [2e38] * w.count("transformer.ln_f.bias"))
w.fill("transformer.wte.weight", [5e-38] + [0.0] * (w.count("transformer.wte.weight") - 1))
w.write(out)
