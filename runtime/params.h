// Parameter values: seeded initialisation, safetensors load and save (Hugging Face names).
#pragma once
#include <cstdint>
#include <string>

#include "runtime/executor.h"

namespace kiln {

// Fills every parameter as its declaration says (normal(0, std), zeros, ones), deterministically
// for a seed; clears gradients and AdamW state.
void init_parameters(Executor& ex, uint64_t seed);

// Loads Hugging Face GPT-2 weights: names with or without "transformer.", the attention mask
// buffers ignored, lm_head.weight accepted when equal to wte. Every parameter must be present
// with its shape; F32, BF16 and F16 are accepted. A path ending in ".bin" is read as an llm.c
// model file (fp32 or bf16, padded vocabulary) instead.
void load_parameters(Executor& ex, const std::string& path);

// Writes parameter values (kind = value) or gradients (kind = grad) as F32 safetensors with
// "transformer."-prefixed names.
enum class ParamField { Value, Grad };
void save_parameters(Executor& ex, const std::string& path, ParamField field = ParamField::Value);

}  // namespace kiln
