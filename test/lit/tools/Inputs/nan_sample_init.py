"""Writes weights that train with finite losses and gradients but whose logits are NaN for a
prompt that starts with token 511 (train-sample-fails.test).
Usage: nan_sample_init.py IN OUT

Channel 0 of wte[511] and of wpe[0] is 3e38: finite alone, infinite summed, which only a sequence
starting with token 511 does (the test's data holds tokens below 100). The first layer norm of
inf is NaN, and so is every logit after it. In training, wte[511] reaches the loss only through
token 511's logit: ln_f gives 0 in channel 0 (weight and bias 0), and 1 in channel 1 (bias 1),
where wte[511] is -3e38, so that logit is about -3e38, its probability exactly 0 and its gradient
0 (a probability of 1/512 times 3e38 would overflow the gradient norm). The updates of ln_f's
channel 0 weight stay far too small (about lr per step) to bring the logit near 0."""
import sys

from safetensors_edit import Weights

src, out = sys.argv[1], sys.argv[2]
w = Weights(src)
C = w.header["transformer.wpe.weight"]["shape"][1]
w.put("transformer.wte.weight", 511 * C + 0, 3e38)
w.put("transformer.wte.weight", 511 * C + 1, -3e38)
w.put("transformer.wpe.weight", 0, 3e38)
w.put("transformer.ln_f.weight", 0, 0.0)
w.put("transformer.ln_f.bias", 0, 0.0)
w.put("transformer.ln_f.weight", 1, 0.0)
w.put("transformer.ln_f.bias", 1, 1.0)
w.write(out)
