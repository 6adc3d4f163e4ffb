// Parameter values: seeded initialisation, safetensors load and save (Hugging Face names).
#pragma once
#include <cstdint>
#include <string>

#include "runtime/executor.h"

namespace kiln {

// Fills every parameter as its declaration says (normal(0, std), zeros, ones), deterministically
// for a seed; clears gradients and AdamW state. The padded vocabulary rows of wte.weight (V..Vp-1
// of its [Vp, C]) are set to 0 whatever the declaration, and stay 0: no gradient reaches them.
void init_parameters(Executor& ex, uint64_t seed);
// For weights load_parameters is about to read (it writes every parameter): the same, with the
// normal(0, std) parameters set to 0 instead of drawn (seconds of Box-Muller for GPT-2 124M).
void clear_parameters(Executor& ex);

// Loads Hugging Face GPT-2 weights: names with or without "transformer.", the attention mask
// buffers ignored, lm_head.weight accepted when equal to wte. Every parameter must be present
// with its shape, wte.weight with the real vocabulary [V, C] (the module's padded rows are set
// to 0); F32, BF16 and F16 are accepted. An llm.c model file (fp32 or bf16, vocabulary padded
// to the Vp of its header) is read too, and a Kiln checkpoint's values (load_checkpoint's checks:
// the same model). Which a file is, its first bytes say (else a name ending in ".bin" is
// llm.c's); a module, program or token shard is refused by name.
void load_parameters(Executor& ex, const std::string& path);

// What a file is by its first bytes, among those Kiln reads and writes, as a phrase that follows
// "is": "a safetensors file (weights)", "an llm.c model (weights)", "a Kiln checkpoint (...)", "a
// Kiln module (...)", "a Kiln training executable", "a program", "an llm.c token shard (...)"; ""
// for anything else (or a file that is no regular file).
std::string file_kind(const std::string& path);
// file_kind's answers that callers test for.
inline constexpr const char* kSafetensorsKind = "a safetensors file (weights)";
inline constexpr const char* kLlmcModelKind = "an llm.c model (weights)";
inline constexpr const char* kModuleKind = "a Kiln module (kiln-run's first argument)";
inline constexpr const char* kExecutableKind = "a Kiln training executable";
// What load_parameters checks before it reads: the file is there, no device, and not another kind
// of file Kiln knows (kiln::Error naming it); its kind as file_kind says.
std::string check_weights_file(const std::string& path);
// The checkpoint a folder of checkpoints (or its file `latest`) stands for, by latest_checkpoint;
// "" for any other path.
std::string checkpoint_named_by(const std::string& path);
// load_parameters, then kiln::Error "PATH: parameter '...' (value) holds a NaN or an infinity
// (CONSEQUENCE)" when a weight is not finite: found before anything runs on them.
void load_finite_parameters(Executor& ex, const std::string& path, const std::string& consequence);

// Writes parameter values (kind = value) or gradients (kind = grad) as F32 safetensors with
// "transformer."-prefixed names, in the shapes of a Hugging Face GPT-2 file: wte.weight [V, C]
// without the padded rows.
// Values are checked first: a diverged update (NaN or infinite weights) is refused rather than
// written over a file of good ones. Errors start with `flag` (the option that named the file).
enum class ParamField { Value, Grad };
void save_parameters(Executor& ex, const std::string& flag, const std::string& path,
                     ParamField field = ParamField::Value);

// The tensor bytes save_parameters writes for the module (the file is a header longer).
uint64_t saved_parameter_bytes(const Module& m);

// "parameter 'h.0.mlp.c_fc.weight' (value)": the first parameter whose value (and with
// `moments`, AdamW m or v: the elements the executor holds) holds a NaN or an infinity, in the
// host copy; "" when all are finite.
std::string first_non_finite(Executor& ex, bool moments);

}  // namespace kiln
